"""Escalation ladders: one per alert name, stepped once per tick.

A ladder runs its current step, waits the step's verify window, and if the
alert is still active climbs to the next step; past the last step it pages
once and waits for the alert to resolve. A refusal by cooldown counts as the
step having run recently (wait its window); a refusal by budget stops the
ladder and pages (the circuit breaker is open). Everything here is plain
data, persisted with the guard state so a restarted agent resumes where it
was without repeating a step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kcops.agent.events import RemediationStep

# Phases of a ladder.
RUN = "run"  # the current step is due
RUNNING = "running"  # its action is executing
VERIFY = "verify"  # waiting for the verify window to show resolution
EXHAUSTED = "exhausted"  # every step done, paged; waiting for resolution
BLOCKED = "blocked"  # breaker open, paged; waiting for resolution


@dataclass
class Ladder:
    alertname: str
    steps: list[dict[str, Any]]
    started_at: float
    trigger: dict[str, Any]
    step: int = 0
    phase: str = RUN
    verify_until: float | None = None
    run_id: str | None = None
    # After a refusal that passes by itself (busy, engine starting): try again then.
    retry_at: float | None = None
    # After an agent restart the local rule engine starts from scratch: until
    # the alert shows up again (pending counts) the ladder holds, and closes as
    # resolved only when this passes without it.
    unconfirmed_until: float | None = None
    # Firing instances: fingerprint -> source ("local" | "alertmanager").
    instances: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def new(
        cls,
        alertname: str,
        steps: tuple[RemediationStep, ...],
        now: float,
        trigger: dict[str, Any],
    ) -> Ladder:
        return cls(
            alertname=alertname,
            steps=[
                {"action": s.action, "params": dict(s.params), "verify_s": s.verify_s}
                for s in steps
            ],
            started_at=now,
            trigger=trigger,
        )

    @property
    def current(self) -> dict[str, Any] | None:
        return self.steps[self.step] if self.step < len(self.steps) else None

    @property
    def id(self) -> str:
        return f"{self.alertname}@{self.started_at:.3f}"

    def ref(self) -> dict[str, Any]:
        return {
            "alertname": self.alertname,
            "step": self.step,
            "of": len(self.steps),
            "id": self.id,
        }

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], now: float, grace_s: float = 0.0) -> Ladder:
        known = set(cls.__dataclass_fields__)
        lad = cls(**{k: v for k, v in data.items() if k in known})
        lad.unconfirmed_until = now + grace_s
        if lad.phase == RUNNING:
            # The agent stopped while the step ran: it may have acted. Never
            # repeat it; verify its effect as if it had finished now.
            cur = lad.current
            lad.phase = VERIFY
            lad.verify_until = now + (float(cur["verify_s"]) if cur else 0.0)
            lad.run_id = None
        return lad
