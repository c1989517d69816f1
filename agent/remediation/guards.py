"""Guard state: cooldowns, hourly budgets with circuit breakers, runs in flight.

Pure bookkeeping with time passed in, so tests need no sleeps. The runner
is the only caller; every action goes through :meth:`Guards.check` before it
runs. Everything but the in-flight set is persisted with the agent's state.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

from kcops.agent.config.actions import GuardsSection
from kcops.agent.outcome import ActionRejected, Refusal

HOUR_S = 3600.0
MAX_ENTRIES = 100_000  # any map or list of a state file; far above what an agent holds


class GuardsState(BaseModel):
    """The guards as the state file keeps them."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    runs: list[tuple[float, str]] = Field(default_factory=list, max_length=MAX_ENTRIES)
    cooldown_until: dict[str, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    breaker_open: dict[str, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    cooldown_owner: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENTRIES)


class GuardsSummary(TypedDict):
    """What ``GET /api/v1/actions`` and the status show of the guards."""

    runs_last_hour: int
    budget_per_hour: int
    cooldowns: dict[str, float]
    breakers_open: list[str]
    in_flight: dict[str, str]


GLOBAL = "*"


@dataclass
class Guards:
    cfg: GuardsSection
    # (t, action) of every run that passed the guards, within the last hour.
    runs: list[tuple[float, str]] = field(default_factory=list)
    # "action|target" -> Unix time the cooldown ends.
    cooldown_until: dict[str, float] = field(default_factory=dict)
    # "action|target" -> the ladder whose step set that cooldown: a ladder's
    # own later steps are paced by verification, not by its cooldowns.
    cooldown_owner: dict[str, str] = field(default_factory=dict)
    # scope ("*" or an action) -> Unix time its breaker opened.
    breaker_open: dict[str, float] = field(default_factory=dict)
    in_flight: dict[str, str] = field(default_factory=dict)  # target -> run id

    # -- limits ------------------------------------------------------------

    def cooldown_s(self, action: str) -> float:
        return self.cfg.cooldown_overrides_s.get(action, self.cfg.cooldown_s)

    def budget(self, scope: str) -> int:
        if scope == GLOBAL:
            return self.cfg.budget_per_hour
        return self.cfg.action_budget_overrides.get(scope, self.cfg.action_budget_per_hour)

    def _prune(self, now: float) -> None:
        cutoff = now - HOUR_S
        if self.runs and self.runs[0][0] <= cutoff:
            self.runs = [r for r in self.runs if r[0] > cutoff]
        for k in [k for k, t in self.cooldown_until.items() if t <= now]:
            del self.cooldown_until[k]
            self.cooldown_owner.pop(k, None)

    def used(self, scope: str, now: float) -> int:
        self._prune(now)
        if scope == GLOBAL:
            return len(self.runs)
        return sum(1 for _, a in self.runs if a == scope)

    # -- the check ------------------------------------------------------------

    def check(
        self,
        action: str,
        target: str,
        now: float,
        *,
        force: bool = False,
        owner: str | None = None,
    ) -> list[str]:
        """Raise ActionRejected when a guard refuses; returns scopes whose breaker just opened.

        ``force`` skips cooldown and budget, never the one-in-flight rule.
        ``owner`` (a ladder id) is not held back by cooldowns its own steps set.
        """
        self._prune(now)
        if target in self.in_flight:
            raise ActionRejected(
                f"{action}: another action ({self.in_flight[target]}) is in flight on {target}",
                Refusal.BUSY,
            )
        if force:
            return []
        key = f"{action}|{target}"
        until = self.cooldown_until.get(key)
        own = owner is not None and self.cooldown_owner.get(key) == owner
        if until is not None and until > now and not own:
            raise ActionRejected(
                f"{action} on {target} is cooling down for {until - now:.0f}s more",
                Refusal.COOLDOWN,
            )
        opened: list[str] = []
        for scope in (action, GLOBAL):
            if self.used(scope, now) >= self.budget(scope):
                if scope not in self.breaker_open:
                    self.breaker_open[scope] = now
                    opened.append(scope)
                what = "all actions" if scope == GLOBAL else action
                raise BreakerOpen(
                    f"budget of {self.budget(scope)} runs/hour for {what} is spent: "
                    "circuit breaker open",
                    opened,
                )
            # Budget available again: the breaker closes by itself.
            self.breaker_open.pop(scope, None)
        return opened

    def start(
        self, action: str, target: str, run_id: str, now: float, owner: str | None = None
    ) -> None:
        self.runs.append((now, action))
        cool = self.cooldown_s(action)
        key = f"{action}|{target}"
        if cool > 0:
            self.cooldown_until[key] = now + cool
            if owner is None:
                self.cooldown_owner.pop(key, None)
            else:
                self.cooldown_owner[key] = owner
        self.in_flight[target] = run_id

    def refund(self, action: str, target: str, t: float) -> None:
        """Undo :meth:`start` of a run that turned out not to act (refused while running)."""
        if (t, action) in self.runs:
            self.runs.remove((t, action))
        key = f"{action}|{target}"
        cool = self.cooldown_s(action)
        if cool > 0 and self.cooldown_until.get(key) == t + cool:
            del self.cooldown_until[key]
            self.cooldown_owner.pop(key, None)

    def finish(self, target: str) -> None:
        self.in_flight.pop(target, None)

    # -- persistence ------------------------------------------------------------

    def to_state(self) -> GuardsState:
        return GuardsState(
            runs=list(self.runs),
            cooldown_until=dict(self.cooldown_until),
            breaker_open=dict(self.breaker_open),
            cooldown_owner=dict(self.cooldown_owner),
        )

    def load(self, st: GuardsState) -> None:
        self.runs = list(st.runs)
        self.cooldown_until = dict(st.cooldown_until)
        self.breaker_open = dict(st.breaker_open)
        self.cooldown_owner = dict(st.cooldown_owner)

    def summary(self, now: float) -> GuardsSummary:
        self._prune(now)
        return {
            "runs_last_hour": len(self.runs),
            "budget_per_hour": self.cfg.budget_per_hour,
            "cooldowns": {k: round(v - now, 1) for k, v in self.cooldown_until.items()},
            "breakers_open": sorted(self.breaker_open),
            "in_flight": dict(self.in_flight),
        }


class BreakerOpen(ActionRejected):
    """The hourly budget is spent. ``opened`` lists the breakers this check opened."""

    def __init__(self, message: str, opened: list[str]) -> None:
        super().__init__(message, Refusal.BUDGET)
        self.opened = opened
