"""Escalation ladders: one per alert name, a pure step ``(ladder, event) -> (ladder, decisions)``.

A ladder runs its current step, waits the step's verify window, and if the
alert is still active climbs to the next step. A step that cannot apply here
(``refused``/``invalid``: unsupported by the engine, not configured, no
target) did not run: the ladder moves straight to the next step, having
spent nothing. Past the last step the ladder ends at the alert's own
severity: a page for a page alert, a ticket record otherwise, saying what
was done: each step that ran and how it ended (ok, failed, timed out, dry
run, interrupted by an agent restart), each step skipped and why, and "no
applicable remediation" when none could run. A refusal by cooldown (the step
ran recently, before this ladder) waits that run's verify window, but is
recorded as skipped, never as run; one by budget stops the ladder (the circuit
breaker pages). Everything here is plain data, persisted with the guard
state so a restarted agent resumes where it was without repeating a step.

:func:`step` does no I/O: the remediation component carries out its
decisions (submit a run, audit, escalate, hold a restore) and feeds each
decided run back as a :class:`Decided` event. :class:`Ladder` is also the shape of
a ladder in the state file: pydantic validates it as it is (bounds, finite numbers),
so a file whose ladders the code could not take is set aside like a corrupt one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field, JsonValue

from kcops.agent.actions.guards import MAX_ENTRIES
from kcops.agent.actions.outcome import ActionName, Outcome
from kcops.agent.actions.records import LadderRef, Trigger
from kcops.agent.events import AlertSource, Step

PAGE_SEVERITIES = frozenset({"page", "critical"})
# A ladder read back from the state file has at most this many steps.
MAX_STEPS = 1000


class Phase(StrEnum):
    RUN = "run"  # the current step is due
    RUNNING = "running"  # its action is executing
    VERIFY = "verify"  # waiting for the verify window to show resolution
    EXHAUSTED = "exhausted"  # every step done or refused, escalated; waiting for resolution
    BLOCKED = "blocked"  # breaker open, paged; waiting for resolution


@dataclass(frozen=True)
class Left:
    """A step the ladder left behind: ``ran`` False when it did not run in this ladder
    (not applicable here, or skipped for cooldown); ``outcome``: how its run ended."""

    step: int
    action: str | None
    t: float
    why: str
    ran: bool = True
    outcome: Outcome | None = None  # None: a record of an older agent (``ran`` says it all)
    error: str | None = None  # what its run answered, when it failed or timed out

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"step must be >= 0, got {self.step}")


@dataclass
class Ladder:
    # When read back from the state file: keys a newer agent added are ignored.
    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(extra="ignore", allow_inf_nan=False)

    alertname: str
    steps: Annotated[tuple[Step, ...], Field(min_length=1, max_length=MAX_STEPS)]
    started_at: float
    trigger: Trigger
    step: Annotated[int, Field(ge=0)] = 0
    phase: Phase = Phase.RUN
    verify_until: float | None = None
    run_id: str | None = None
    # After a refusal that passes by itself (busy, engine starting): try again then.
    retry_at: float | None = None
    # After an agent restart the local rule engine starts from scratch: until
    # the alert shows up again (pending counts) the ladder holds, and closes as
    # resolved only when this passes without it.
    unconfirmed_until: float | None = None
    # How the current step's run was decided (VERIFY: what the window is for), and
    # why it was skipped for cooldown (the guard's words).
    outcome: Outcome | None = None
    skip_why: str | None = None
    # When the current step was first refused for cooldown: it is tried again until its
    # verify window has passed since, then left as skipped.
    cooled_since: float | None = None
    # Firing instances: fingerprint -> source.
    instances: Annotated[dict[str, AlertSource], Field(max_length=MAX_ENTRIES)] = field(
        default_factory=dict
    )
    # One entry per step left behind.
    history: Annotated[list[Left], Field(max_length=MAX_ENTRIES)] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.step > len(self.steps):
            raise ValueError(f"step {self.step} is past the ladder's {len(self.steps)} steps")

    @classmethod
    def new(cls, alertname: str, steps: tuple[Step, ...], now: float, trigger: Trigger) -> Ladder:
        return cls(alertname=alertname, steps=tuple(steps), started_at=now, trigger=trigger)

    @property
    def current(self) -> Step | None:
        return self.steps[self.step] if self.step < len(self.steps) else None

    @property
    def id(self) -> str:
        return f"{self.alertname}@{self.started_at:.3f}"

    @property
    def severity(self) -> str:
        return self.trigger.severity

    def ref(self) -> LadderRef:
        # Past the last step the index would read "step 2/1": show the last one.
        return LadderRef(
            alertname=self.alertname,
            step=min(self.step, max(0, len(self.steps) - 1)),
            of=len(self.steps),
            id=self.id,
        )

    def resumed(self, now: float, grace_s: float) -> Ladder:
        """This ladder as a restarted agent takes it up (read from the state file)."""
        lad = replace(self, unconfirmed_until=now + grace_s)
        if lad.phase is Phase.RUNNING:
            # The agent stopped while the step ran: it may have acted. Never
            # repeat it; verify its effect as if it had finished now.
            cur = lad.current
            lad.phase = Phase.VERIFY
            lad.verify_until = now + (cur.verify_s if cur else 0.0)
            lad.run_id = None
            lad.outcome = Outcome.INTERRUPTED
        return lad


# -- events ------------------------------------------------------------------


@dataclass(frozen=True)
class Tick:
    now: float


@dataclass(frozen=True)
class Decided:
    """The current step's run was decided. ``outcome`` None: its run was lost (restart)."""

    now: float
    outcome: Outcome | None
    run_id: str | None = None
    error: str | None = None
    params: Mapping[str, JsonValue] = field(default_factory=dict)


Event = Tick | Decided


# -- decisions -----------------------------------------------------------------


@dataclass(frozen=True)
class Submit:
    """Run this step's action with its parameters."""

    step: Step


@dataclass(frozen=True)
class Audit:
    """A ladder record: ``event`` and what it names (None: not part of this event)."""

    event: str
    why: str | None = None
    ran: tuple[str, ...] | None = None
    refused: tuple[str, ...] | None = None
    skipped: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Escalate:
    """Tell a human: a page when ``page``, else a ticket record at the alert's severity."""

    message: str
    page: bool
    severity: str


@dataclass(frozen=True)
class HoldRestore:
    """A fallback ran: restore normal routing once the alert stayed resolved."""

    run_id: str | None
    params: Mapping[str, JsonValue]


Decision = Submit | Audit | Escalate | HoldRestore


def step(lad: Ladder, ev: Event, *, retry_s: float) -> tuple[Ladder, list[Decision]]:
    """The ladder after ``ev`` and what to do about it. Pure: the input is not changed."""
    lad = replace(lad, history=list(lad.history), instances=dict(lad.instances))
    out: list[Decision] = []
    if isinstance(ev, Decided):
        _decided(lad, ev, retry_s, out)
    else:
        _tick(lad, ev.now, out)
    return lad, out


def _tick(lad: Ladder, now: float, out: list[Decision]) -> None:
    if lad.phase is Phase.VERIFY:
        if lad.verify_until is not None and now < lad.verify_until:
            return
        if lad.outcome == Outcome.SKIPPED_COOLDOWN:
            # It did not run in this ladder: the window was the earlier run's.
            why = f"step {_action(lad)} skipped_cooldown ({lad.skip_why or 'ran recently'}); "
            _leave(lad, now, why + "not resolved within the verify window", ran=False, out=out)
        else:
            _leave(lad, now, "not resolved within the verify window", ran=True, out=out)
    if lad.phase is not Phase.RUN:
        return  # RUNNING: wait for its Decided; EXHAUSTED, BLOCKED: wait for resolution
    if lad.retry_at is not None and now < lad.retry_at:
        return
    lad.retry_at = None
    cur = lad.current
    if cur is None:
        _end(lad, out)
        return
    lad.phase = Phase.RUNNING
    lad.run_id = None
    out.append(Submit(cur))


def _decided(lad: Ladder, ev: Decided, retry_s: float, out: list[Decision]) -> None:
    cur = lad.current
    if lad.phase is not Phase.RUNNING or cur is None:
        return
    lad.run_id = ev.run_id
    o = ev.outcome
    lad.outcome = Outcome.INTERRUPTED if o is None else o
    lad.skip_why = ev.error if o is Outcome.SKIPPED_COOLDOWN else None
    if o is None or o in (Outcome.OK, Outcome.DRY_RUN):
        lad.phase = Phase.VERIFY
        lad.verify_until = ev.now + cur.verify_s
        if cur.action == ActionName.FALLBACK_TO_BASE and o in (Outcome.OK, Outcome.DRY_RUN):
            out.append(HoldRestore(ev.run_id, dict(ev.params)))
    elif o is Outcome.SKIPPED_COOLDOWN:
        # The step ran recently, maybe for another incident (a restart for
        # KcopsEngineDown, then a stall): try it again as the cooldown allows, for one
        # verify window; then leave it as skipped (a verify window that ends now).
        lad.cooled_since = ev.now if lad.cooled_since is None else lad.cooled_since
        if ev.now - lad.cooled_since < cur.verify_s:
            lad.phase = Phase.RUN
            lad.retry_at = ev.now + retry_s
        else:
            lad.phase = Phase.VERIFY
            lad.verify_until = ev.now
    elif o in (
        Outcome.SKIPPED_BUSY,
        Outcome.SKIPPED_STARTING,
        Outcome.SKIPPED_OFF,
        Outcome.SKIPPED_NOT_DURABLE,
    ):
        lad.phase = Phase.RUN
        lad.retry_at = ev.now + retry_s
    elif o is Outcome.SKIPPED_BUDGET:
        lad.phase = Phase.BLOCKED
        out.append(Audit("blocked", why=ev.error))
    elif o.not_applicable:
        _leave(lad, ev.now, f"step {cur.action} {o}: {ev.error}", ran=False, out=out)
        _tick(lad, ev.now, out)
    else:  # failed, timeout: it ran; the next rung, now
        _leave(lad, ev.now, f"step {cur.action} {o}: {ev.error}", ran=True, out=out, err=ev.error)
        _tick(lad, ev.now, out)


def _leave(
    lad: Ladder, now: float, why: str, *, ran: bool, out: list[Decision], err: str | None = None
) -> None:
    cur = lad.current
    left = Left(lad.step, cur.action if cur else None, now, why, ran, lad.outcome, err)
    lad.history.append(left)
    lad.step += 1
    lad.phase = Phase.RUN
    lad.verify_until = None
    lad.outcome = lad.skip_why = None
    lad.cooled_since = None
    out.append(Audit("climb" if ran else "skipped", why=why))


def _action(lad: Ladder) -> str:
    cur = lad.current
    return cur.action if cur else "?"


_DID: dict[str, str] = {
    Outcome.OK: "{a} ran",
    Outcome.DRY_RUN: "{a} would have run (dry run)",
    Outcome.FAILED: "{a} ran and failed",
    Outcome.TIMEOUT: "{a} ran and timed out",
    Outcome.INTERRUPTED: "{a} was interrupted by an agent restart (it may have acted)",
}


def _did(h: Left) -> str:
    """What a step that ran did, in the words of a page (why it failed, when it did)."""
    did = _DID.get(h.outcome or Outcome.OK, "{a} ran").format(a=h.action)
    return f"{did}: {h.error[:300]}" if h.error else did


def _end(lad: Ladder, out: list[Decision]) -> None:
    """Past the last step: audit what ran, what was skipped and what could not apply,
    and tell a human exactly that (never "ran" for a step that did not)."""
    lad.phase = Phase.EXHAUSTED
    ran_h = [h for h in lad.history if h.ran]
    ran = tuple(str(h.action) for h in ran_h)
    cooled = [h for h in lad.history if not h.ran and h.outcome == Outcome.SKIPPED_COOLDOWN]
    skipped = tuple(f"{h.action} ({h.why})" for h in cooled)
    refused = tuple(f"{h.action} ({h.why})" for h in lad.history if not h.ran and h not in cooled)
    page = lad.severity in PAGE_SEVERITIES
    if ran:
        msg = f"{lad.alertname} is still active after remediation: {'; '.join(map(_did, ran_h))}"
        event = "exhausted"
    elif skipped:
        msg = f"{lad.alertname} is still active and no remediation ran in this ladder"
        event = "nothing_ran"
    else:
        msg = f"{lad.alertname}: no applicable remediation: {'; '.join(refused) or 'no steps'}"
        out.append(Audit("no_applicable_remediation", refused=refused))
        out.append(Escalate(msg, page=page, severity=lad.severity))
        return
    if skipped:
        msg += f"; skipped: {'; '.join(skipped)}"
    if refused:
        msg += f"; not applicable: {'; '.join(refused)}"
    out.append(Audit(event, ran=ran, refused=refused, skipped=skipped))
    out.append(Escalate(msg, page=page, severity=lad.severity))
