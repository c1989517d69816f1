"""The runner: every action goes through it, and it owns every guard.

``submit`` checks mode, parameters, one-in-flight, cooldown and budget; then
either records a dry run or starts the action as an asyncio task (the loop
never waits on an action). The task itself audits, counts and traces the
outcome, so a run started from a ladder, the control API or the
Alertmanager webhook is accounted for in exactly the same way.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Status, StatusCode, Tracer

from kcops.agent.actions.audit import AuditLog
from kcops.agent.actions.base import ActionContext, ActionResult, Registry
from kcops.agent.actions.engine import EngineAdmin
from kcops.agent.actions.guards import BreakerOpen, Guards
from kcops.agent.clock import Clock
from kcops.agent.config import Config
from kcops.agent.errors import ActionRejected

log = logging.getLogger("kcops.agent.actions")

# Outcomes, the values of kcops_action_runs_total's `outcome` label.
OK, FAILED, TIMEOUT, DRY_RUN = "ok", "failed", "timeout", "dry_run"
REFUSED = "refused"  # the action itself said no (unsupported, at bound)
INVALID = "invalid"
SKIPPED = {  # refused by a guard, by reason
    "cooldown": "skipped_cooldown",
    "budget": "skipped_budget",
    "busy": "skipped_busy",
    "off": "skipped_off",
    "starting": "skipped_starting",
}

_SCOPES = {"notify": "notify", "scale_out": "replicas"}


def scope_of(action: str) -> str:
    """What an action acts on, for one-in-flight and cooldown: the engine unless said."""
    return _SCOPES.get(action, "engine")


@dataclass
class Run:
    id: str
    action: str
    params: dict[str, Any]
    target: str
    mode: str
    t: float
    trigger: dict[str, Any] | None = None
    ladder: dict[str, Any] | None = None
    forced: bool = False
    reason: str | None = None
    outcome: str | None = None
    error: str | None = None
    result: ActionResult | None = None
    duration_s: float = 0.0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def record(self) -> dict[str, Any]:
        return {
            "kind": "action",
            "ts": self.t,
            "run_id": self.id,
            "action": self.action,
            "params": self.params,
            "target": self.target,
            "mode": self.mode,
            "outcome": self.outcome,
            "error": self.error,
            "duration_s": round(self.duration_s, 6),
            "before": self.result.before if self.result else None,
            "after": self.result.after if self.result else None,
            "detail": self.result.detail if self.result else None,
            "result": self.result.data if self.result else None,
            "trigger": self.trigger,
            "ladder": self.ladder,
            "forced": self.forced,
            "reason": self.reason,
        }


class Runner:
    def __init__(
        self,
        config: Config,
        registry: Registry,
        guards: Guards,
        audit: AuditLog,
        engine: EngineAdmin,
        tracer: Tracer,
        clock: Clock,
        services: Mapping[str, Any],
        *,
        on_change: Callable[[], None] = lambda: None,
        on_breaker: Callable[[str, Run], None] = lambda scope, run: None,
    ) -> None:
        self.config = config
        self.registry = registry
        self.guards = guards
        self.audit = audit
        self.engine = engine
        self.tracer = tracer
        self.clock = clock
        self.services = services
        self.on_change = on_change
        self.on_breaker = on_breaker
        self.counts: dict[tuple[str, str], int] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._seq = itertools.count(1)
        self._boot = uuid.uuid4().hex[:6]

    # -- bookkeeping ----------------------------------------------------------

    def _finish(self, run: Run, outcome: str, error: str | None = None) -> None:
        run.outcome = outcome
        run.error = error
        key = (run.action, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.audit.append(run.record())
        level = logging.INFO if outcome in (OK, DRY_RUN) else logging.WARNING
        log.log(
            level,
            "action %s on %s: %s%s%s",
            run.action,
            run.target,
            outcome,
            f" ({error})" if error else "",
            f" [{run.result.detail}]" if run.result and run.result.detail else "",
        )

    def _span(self, run: Run, outcome: str, error: str | None) -> None:
        """A zero-length span for a run decided without executing (dry run, refusal)."""
        span = self.tracer.start_span(f"action {run.action}", start_time=int(run.t * 1e9))
        self._span_attrs(span, run, outcome)
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=int(run.t * 1e9))

    @staticmethod
    def _span_attrs(span: Any, run: Run, outcome: str) -> None:
        span.set_attribute("kcops.action", run.action)
        span.set_attribute("kcops.target", run.target)
        span.set_attribute("kcops.mode", run.mode)
        span.set_attribute("kcops.outcome", outcome)
        span.set_attribute("kcops.run_id", run.id)
        if run.ladder:
            span.set_attribute("kcops.alertname", str(run.ladder.get("alertname")))
            span.set_attribute("kcops.step", int(run.ladder.get("step", 0)))

    # -- submit --------------------------------------------------------------------

    def submit(
        self,
        action: str,
        params: Mapping[str, Any] | None = None,
        *,
        now: float | None = None,
        trigger: dict[str, Any] | None = None,
        ladder: dict[str, Any] | None = None,
        force: bool = False,
        reason: str | None = None,
        dry_run: bool = False,
    ) -> Run:
        """Decide and (maybe) start one run. Never raises for a refusal: see ``run.outcome``.

        A returned run whose ``done`` is False is executing; await ``run.task``.
        """
        now = self.clock() if now is None else now
        mode = self.config.actions.mode
        owner = str(ladder["id"]) if ladder and "id" in ladder else None
        if dry_run and mode == "enforce":
            mode = "dry-run"
        run = Run(
            id=f"{self._boot}-{next(self._seq)}",
            action=action,
            params=dict(params or {}),
            target=scope_of(action),
            mode=mode,
            t=now,
            trigger=trigger,
            ladder=ladder,
            forced=force,
            reason=reason,
        )
        try:
            if force and not (isinstance(reason, str) and reason.strip()):
                raise ActionRejected("force needs a reason", "invalid")
            spec = self.registry.get(action)
            parsed = spec.parse(params)
            run.params = parsed.model_dump(mode="json")
            if mode == "off":
                raise ActionRejected("remediation mode is off", "off")
            if spec.precheck is not None:
                spec.precheck(self.config, self.services, now)
            self.guards.check(action, run.target, now, force=force, owner=owner)
        except BreakerOpen as exc:
            self._refuse(run, exc)
            for scope in exc.opened:
                self.on_breaker(scope, run)
            return run
        except ActionRejected as exc:
            self._refuse(run, exc)
            return run
        if dry_run:
            # A one-off dry run asked of an enforcing agent is a question, not a
            # run: it must not spend the real cooldown or budget.
            run.result = ActionResult(detail=f"dry run: would run {action} {run.params}")
            self._finish(run, DRY_RUN)
            self._span(run, DRY_RUN, None)
            return run
        self.guards.start(action, run.target, run.id, now, owner)
        self.on_change()
        if mode == "dry-run":
            # A dry-run agent keeps its guards as if it acted, so its log shows
            # the decisions (cooldowns, budget) an enforcing agent would take.
            self.guards.finish(run.target)
            run.result = ActionResult(detail=f"dry run: would run {action} {run.params}")
            self._finish(run, DRY_RUN)
            self._span(run, DRY_RUN, None)
            return run
        run.task = asyncio.get_running_loop().create_task(self._execute(run, spec, parsed))
        self.tasks.add(run.task)
        run.task.add_done_callback(self.tasks.discard)
        return run

    def _refuse(self, run: Run, exc: ActionRejected) -> None:
        outcome = SKIPPED.get(
            exc.reason, INVALID if exc.reason in ("invalid", "unknown") else REFUSED
        )
        self._finish(run, outcome, str(exc))
        self._span(run, outcome, str(exc))

    async def _execute(self, run: Run, spec: Any, parsed: Any) -> None:
        t0 = time.monotonic()
        outcome, error = OK, None
        with self.tracer.start_as_current_span(
            f"action {run.action}", start_time=int(run.t * 1e9)
        ) as span:
            actx = ActionContext(
                config=self.config,
                engine=self.engine,
                target=run.target,
                now=run.t,
                services=self.services,
            )
            try:
                run.result = await asyncio.wait_for(
                    spec.fn(actx, parsed), timeout=self.config.actions.guards.action_timeout_s
                )
            except TimeoutError:
                outcome, error = TIMEOUT, "timed out"
            except ActionRejected as exc:
                outcome, error = REFUSED, str(exc)
            except asyncio.CancelledError:
                outcome, error = FAILED, "cancelled (agent stopping)"
                raise
            except Exception as exc:
                outcome, error = FAILED, f"{type(exc).__name__}: {exc}"
            finally:
                run.duration_s = time.monotonic() - t0
                self._span_attrs(span, run, outcome)
                if error:
                    span.set_status(Status(StatusCode.ERROR, error))
                self.guards.finish(run.target)
                self._finish(run, outcome, error)
                self.on_change()

    async def drain(self, timeout_s: float) -> None:
        """Wait for runs in flight, then cancel what is left."""
        if not self.tasks:
            return
        _, pending = await asyncio.wait(list(self.tasks), timeout=timeout_s)
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
