"""The shape of remediation's state file (version 1), typed down to its inner records.

Everything the agent rebuilds at start (guards, ladders, restores) is checked
here first, so that a file of the right top level but a wrong inside (a ladder
with no steps, a phase that does not exist, a run that is not ``[t, action]``)
is set aside like a corrupt one instead of failing the start, or failing every
tick later. Unknown keys are ignored (a newer agent may add some); numbers are
finite.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kcops.agent.actions.ladder import Phase

MAX_ENTRIES = 100_000  # any map or list of the file; far above what an agent holds


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class GuardsState(_Record):
    runs: list[tuple[float, str]] = Field(default_factory=list, max_length=MAX_ENTRIES)
    cooldown_until: dict[str, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    breaker_open: dict[str, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    cooldown_owner: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENTRIES)


class StepState(_Record):
    action: str
    params: dict[str, Any] = Field(default_factory=dict)
    verify_s: float = Field(ge=0)


class HistoryState(_Record):
    step: int = Field(ge=0)
    action: str | None
    t: float
    why: str
    ran: bool = True


class TriggerState(BaseModel):
    """The alert transition that started a ladder; its labels are what later code reads."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    labels: dict[str, str] = Field(default_factory=dict)


class LadderState(_Record):
    alertname: str
    steps: list[StepState] = Field(min_length=1, max_length=1000)  # none: never a ladder
    started_at: float
    trigger: TriggerState
    step: int = Field(0, ge=0)
    phase: Phase = Phase.RUN
    verify_until: float | None = None
    run_id: str | None = None
    retry_at: float | None = None
    unconfirmed_until: float | None = None
    instances: dict[str, Literal["local", "alertmanager"]] = Field(
        default_factory=dict, max_length=MAX_ENTRIES
    )
    history: list[HistoryState] = Field(default_factory=list, max_length=MAX_ENTRIES)

    @model_validator(mode="after")
    def _step_in_range(self) -> LadderState:
        if self.step > len(self.steps):
            raise ValueError(f"step {self.step} is past the ladder's {len(self.steps)} steps")
        return self


class RestoreState(_Record):
    since: float | None = None
    run_id: str | None = None
    hold_s: float = Field(ge=0)


class RemediationState(_Record):
    """The whole file. ``model_dump()`` gives what :meth:`Remediation.start` rebuilds from."""

    version: int = Field(1, ge=1, le=1)
    guards: GuardsState = Field(default_factory=GuardsState)
    ladders: dict[str, LadderState] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    ended: dict[str, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    restores: dict[str, RestoreState] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    # alertname -> fingerprint -> where the Alertmanager alert points (alertmanager.Addressed)
    addressed: dict[str, dict[str, str]] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    replicas: int | None = Field(None, ge=0, le=100_000)
