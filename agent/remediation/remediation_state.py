"""The shape of remediation's state file (version 1), typed down to its inner records.

Everything the agent rebuilds at start (guards, ladders, restores) is checked
here first, so that a file of the right top level but a wrong inside (a ladder
with no steps, a phase that does not exist, a run that is not ``[t, action]``)
is set aside like a corrupt one instead of failing the start, or failing every
tick later. Unknown keys are ignored (a newer agent may add some); numbers are
finite.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kcops.agent.remediation.guards import MAX_ENTRIES, GuardsState
from kcops.agent.remediation.ladder import Ladder


class _StateModel(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class RestoreState(_StateModel):
    since: float | None = None
    run_id: str | None = None
    hold_s: float = Field(ge=0)


class RemediationState(_StateModel):
    """The whole file, as :meth:`Remediation.start` rebuilds from it."""

    version: int = Field(1, ge=1, le=1)
    guards: GuardsState = Field(default_factory=GuardsState)
    ladders: dict[str, Ladder] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    ended: dict[str, float] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    restores: dict[str, RestoreState] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    # alertname -> fingerprint -> where the Alertmanager alert points (alertmanager.Addressed)
    addressed: dict[str, dict[str, str]] = Field(default_factory=dict, max_length=MAX_ENTRIES)
    replicas: int | None = Field(None, ge=0, le=100_000)
