"""What every action is: a plain async function over a typed parameter model.

An action never applies guards itself; :class:`~kcops.agent.remediation.runner.Runner`
does that for all of them. It raises
:class:`~kcops.agent.outcome.ActionRejected` when it cannot do what was asked
(unsupported engine, already at a bound) and lets anything else raise.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from kcops.agent.outcome import ActionName, ActionRejected, Refusal
from kcops.agent.yamlload import excerpt

if TYPE_CHECKING:
    from kcops.agent.config import Config
    from kcops.agent.engine import Engine
    from kcops.agent.store import Store

JSONObject = dict[str, JsonValue]


class Replicas:
    """The desired replica count the agent publishes (scale_out); persisted with the guards."""

    def __init__(self, desired: int | None = None) -> None:
        self.desired = desired


class SupervisorHandle(Protocol):
    """What actions need of the engine supervisor (:mod:`kcops.agent.engine.supervisor`)."""

    def starting(self, now: float) -> bool: ...

    def respawning(self) -> bool: ...

    def backing_off(self) -> str | None:
        """Why the supervisor owns the engine's next start now (crash backoff), or None."""
        ...

    async def restart(self, reason: str = "requested", *, drain: bool = True) -> JSONObject:
        """``drain=False``: a stalled or hung engine; kill its tree at once."""
        ...


class Params(BaseModel):
    """Base of every parameter model: unknown keys are errors, types are strict.

    Strict: ``"yes"`` or ``1`` is not a boolean, ``"5"`` or ``true`` not an integer
    (an int is still a float). Parameters come from rule files, the CLI and the
    control API already typed; a string where a boolean belongs is a mistake
    to refuse, not to guess (``drop_running: "no"`` must never preempt requests).
    A number is finite: ``hold_s: Infinity`` is refused, never run.
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class NoParams(Params):
    pass


@dataclass(frozen=True)
class Check:
    """What a precheck may look at: no I/O, so dry-run and enforce decide alike."""

    config: Config
    engine: Engine
    supervisor: SupervisorHandle | None
    now: float


@dataclass
class ActionContext:
    """What an action may use. Built by the runner for each run."""

    config: Config
    engine: Engine
    target: str
    now: float
    supervisor: SupervisorHandle | None = None
    store: Store | None = None
    # scale_out's published desired count
    replicas: Replicas | None = None


class Change(BaseModel):
    """An engine's answer to an admin change (route, top-N): its state before and after."""

    model_config = ConfigDict(extra="ignore")
    before: JsonValue = None
    after: JsonValue = None


@dataclass
class ActionResult:
    """What a run did. ``before``/``after`` are what the engine reported."""

    detail: str = ""
    before: JsonValue = None
    after: JsonValue = None
    data: JSONObject = field(default_factory=dict)

    def to_json(self) -> JSONObject:
        return {"detail": self.detail, "before": self.before, "after": self.after, **self.data}


ActionFn = Callable[[ActionContext, Any], Awaitable[ActionResult]]
# Runs before any guard, in dry-run as in enforce: raise ActionRejected to refuse
# without using the budget or starting a cooldown (unsupported by the engine,
# not configured, no target, the engine still starting). It looks at configuration
# and local facts that cost nothing to read (a file's existence), never the engine.
Precheck = Callable[[Check, Any], None]
# Runs after the prechecks and guards and before acting, in dry-run as in enforce:
# it may read (the engine's state document) but never change anything. Raising
# ActionRejected refuses the run (at a bound, ...): a dry run then records "would
# refuse" where an enforcing run refuses, and neither spends cooldown or budget.
Look = Callable[[ActionContext, Any], Awaitable[None]]


def kube_token(check: Check, what: str) -> None:
    """A precheck of the actions that call the Kubernetes API: refuse (``not_configured``)
    when the service account token file is missing (every call would be refused for it)."""
    path = check.config.actions.kubernetes.token_file
    if not path.is_file():
        raise ActionRejected(
            f"{what}: no Kubernetes service account token at {path} (mount the service "
            "account token, or set actions.kubernetes.token_file)",
            Refusal.NOT_CONFIGURED,
        )


# What a run acts on, for one-in-flight and cooldown: the engine, unless said.
Target = Literal["engine", "notify", "replicas"]


@dataclass(frozen=True)
class ActionSpec:
    name: ActionName
    fn: ActionFn
    params: type[Params]
    help: str
    precheck: Precheck | None = None
    look: Look | None = None
    # pod: runs in every pod's agent; fleet: once per fleet, under the fleet
    # lease (kcops.agent.actions.lease_core), which the action itself takes.
    scope: Literal["pod", "fleet"] = "pod"
    # False: run by kcops itself or by hand, never named by a rule's ladder.
    ladder: bool = True
    target: Target = "engine"

    def target_of(self, alertname: str | None) -> str:
        """What one run acts on. A notice is about its alert (``notify:<alertname>``), so
        the notice for one alert is never held back by another's cooldown (the per-hour
        budget still bounds them all); ``notify`` when asked by hand."""
        if self.target == "notify" and alertname:
            return f"notify:{alertname}"
        return self.target

    def parse(self, raw: Mapping[str, JsonValue] | None) -> Params:
        """Validate raw parameters; a bad value raises ActionRejected(reason="invalid")."""
        try:
            return self.params.model_validate(dict(raw or {}))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p)[:40] for p in e['loc']) or '<params>'}: {e['msg']}"
                f" (got {excerpt(e.get('input'))})"
                for e in exc.errors()[:5]
            )
            raise ActionRejected(
                f"{self.name}: invalid parameters: {problems}", Refusal.INVALID
            ) from None

    def describe(self) -> JSONObject:
        return {
            "name": self.name,
            "help": self.help,
            "scope": self.scope,
            "params": self.params.model_json_schema(),
        }


class Registry:
    """Actions by name. Registered explicitly; nothing registers itself."""

    def __init__(self) -> None:
        self._specs: dict[str, ActionSpec] = {}

    def register(self, spec: ActionSpec) -> None:
        if spec.name in self._specs:
            raise ValueError(f"action {spec.name!r} registered twice")
        self._specs[spec.name] = spec

    def get(self, name: str) -> ActionSpec:
        try:
            return self._specs[name]
        except KeyError:
            raise ActionRejected(
                f"unknown action {name!r}; known: {', '.join(sorted(self._specs))}", Refusal.UNKNOWN
            ) from None

    def find(self, name: str) -> ActionSpec | None:
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return sorted(self._specs)

    def ladder_params(self) -> dict[str, type[Params]]:
        """What a rule's ``remediation:`` step may name, with each one's parameter model:
        handed to the rule loader (:data:`kcops.agent.rules.rulefile.ActionParams`)."""
        return {n: self._specs[n].params for n in self.names() if self._specs[n].ladder}

    def specs(self) -> list[ActionSpec]:
        return [self._specs[n] for n in self.names()]
