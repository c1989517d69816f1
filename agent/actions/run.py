"""One run of an action, as the runner decides and executes it, and what it writes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from kcops.agent.actions import outcome as outcome_mod
from kcops.agent.actions.base import ActionResult
from kcops.agent.actions.outcome import Outcome
from kcops.agent.actions.records import (
    ActionRecord,
    JSONObject,
    LadderRef,
    StartedRecord,
    Trigger,
)

__all__ = ["Run"]


@dataclass
class Run:
    id: str
    action: str
    params: JSONObject
    target: str
    mode: str
    t: float
    trigger: Trigger | None = None
    ladder: LadderRef | None = None
    forced: bool = False
    reason: str | None = None
    outcome: Outcome | None = None
    error: str | None = None
    # Why it was refused, as a code (unsupported, not_configured, at_bound, ...).
    refusal: str | None = None
    result: ActionResult | None = None
    duration_s: float = 0.0
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def _asked(self) -> JSONObject:
        """What was asked: the fields its started record and its outcome record share."""
        return {
            "ts": self.t, "run_id": self.id, "action": self.action, "params": self.params,
            "target": self.target, "mode": self.mode, "forced": self.forced,
            "reason": self.reason,
        }  # fmt: skip

    def started(self) -> StartedRecord:
        """The record written (durably) before the run acts."""
        return StartedRecord(**self._asked(), trigger=self.trigger, ladder=self.ladder)

    @property
    def stream(self) -> tuple[str, str, str, str]:
        """What a repeat of this run's decision is counted against (:mod:`.auditrepeat`)."""
        alert = (self.ladder.alertname if self.ladder else None) or (
            self.trigger.alertname if self.trigger else None
        )
        return ("action", self.action, self.target, alert or "")

    def repeat_key(self) -> tuple[str, ...] | None:
        """A decision that did not act and may repeat while its cause lasts (a refusal
        of a ladder step, a restore, a retry); None: written every time (a run that
        acted, or anything asked by hand or over the API)."""
        if self.outcome is None or self.outcome in outcome_mod.RAN:
            return None
        if self.trigger is None or self.trigger.source == "api":
            return None  # asked by hand: every answer acknowledges its own record
        return (self.outcome, self.refusal or "", self.mode)

    def record(self) -> ActionRecord:
        res = self.result
        return ActionRecord(
            **self._asked(),
            trigger=self.trigger,
            ladder=self.ladder,
            outcome=self.outcome,
            error=self.error,
            duration_s=round(self.duration_s, 6),
            before=res.before if res else None,
            after=res.after if res else None,
            detail=res.detail if res else None,
            result=res.data if res else None,
            refusal=self.refusal,
        )
