"""The shape of remediation's state file (version 1), typed down to its inner records.

Everything the agent rebuilds at start (guards, ladders, restores) is checked
here first, so that a file of the right top level but a wrong inside (a ladder
with no steps, a phase that does not exist, a run that is not ``[t, action]``)
is set aside like a corrupt one instead of failing the start, or failing every
tick later. Unknown keys are ignored (a newer agent may add some); numbers are
finite.
"""

from __future__ import annotations

from dataclasses import fields

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kcops.agent.actions.guards import MAX_ENTRIES, GuardsState
from kcops.agent.actions.ladder import Ladder, Left, Phase
from kcops.agent.actions.records import Trigger
from kcops.agent.events import AlertSource, Step


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class LadderState(_Record):
    alertname: str
    steps: list[Step] = Field(min_length=1, max_length=1000)  # none: never a ladder
    started_at: float
    trigger: Trigger
    step: int = Field(0, ge=0)
    phase: Phase = Phase.RUN
    verify_until: float | None = None
    run_id: str | None = None
    retry_at: float | None = None
    unconfirmed_until: float | None = None
    outcome: str | None = None
    skip_why: str | None = None
    cooled_since: float | None = None
    instances: dict[str, AlertSource] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    history: list[Left] = Field(default_factory=list, max_length=MAX_ENTRIES)

    @model_validator(mode="after")
    def _step_in_range(self) -> LadderState:
        if self.step > len(self.steps):
            raise ValueError(f"step {self.step} is past the ladder's {len(self.steps)} steps")
        return self

    @classmethod
    def of(cls, lad: Ladder) -> LadderState:
        return cls.model_validate({f.name: getattr(lad, f.name) for f in fields(lad)})

    def ladder(self) -> Ladder:
        """The ladder as saved (:meth:`Ladder.resumed` makes it a restarted agent's)."""
        return Ladder(
            alertname=self.alertname,
            steps=tuple(self.steps),
            started_at=self.started_at,
            trigger=self.trigger,
            step=self.step,
            phase=self.phase,
            verify_until=self.verify_until,
            run_id=self.run_id,
            retry_at=self.retry_at,
            unconfirmed_until=self.unconfirmed_until,
            outcome=self.outcome,
            skip_why=self.skip_why,
            cooled_since=self.cooled_since,
            instances=dict(self.instances),
            history=list(self.history),
        )


class RestoreState(_Record):
    since: float | None = None
    run_id: str | None = None
    hold_s: float = Field(ge=0)


class RemediationState(_Record):
    """The whole file, as :meth:`Remediation.start` rebuilds from it."""

    version: int = Field(1, ge=1, le=1)
    guards: GuardsState = Field(default_factory=GuardsState)
    ladders: dict[str, LadderState] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    ended: dict[str, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    restores: dict[str, RestoreState] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    # alertname -> fingerprint -> where the Alertmanager alert points (alertmanager.Addressed)
    addressed: dict[str, dict[str, str]] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    replicas: int | None = Field(None, ge=0, le=100_000)
