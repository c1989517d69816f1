"""Escalation ladders: one per alert name, a pure step ``(ladder, event) -> (ladder, decisions)``.

A ladder runs its current step, waits the step's verify window, and if the
alert is still active climbs to the next step; a step that cannot apply here
moves it straight on, having spent nothing. Past the last step it ends at the
alert's own severity (a page or a ticket record) saying what each step did
(docs/remediation.md).

:func:`step` does no I/O and is the ladder's one writer: the driver carries out its
decisions (submit a run, audit, escalate, hold a restore) and feeds back what it
learns as events, keeping the ladder each step returns (frozen). :class:`Ladder` is
also the shape of a ladder in the state file, so a restarted agent resumes where it
was without repeating a step; pydantic validates it as it is (bounds, finite
numbers), and a file whose ladders the code could not take is set aside.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, ClassVar

from pydantic import ConfigDict, Field, JsonValue

from kcops.agent.events import AlertSource, Step
from kcops.agent.outcome import ActionName, Outcome, Phase
from kcops.agent.remediation.guards import MAX_ENTRIES
from kcops.agent.remediation.records import LadderRef, Trigger

PAGE_SEVERITIES = frozenset({"page", "critical"})
# A ladder read back from the state file has at most this many steps.
MAX_STEPS = 1000


@dataclass(frozen=True)
class Left:
    """A step the ladder left behind: ``ran`` False when it did not run in this ladder
    (not applicable here, or skipped for cooldown); ``outcome``: how its run ended."""

    step: int
    action: ActionName | None
    t: float
    why: str
    ran: bool = True
    outcome: Outcome | None = None  # None: a record of an older agent (``ran`` says it all)
    error: str | None = None  # what its run answered, when it failed or timed out

    def __post_init__(self) -> None:
        if self.step < 0:
            raise ValueError(f"step must be >= 0, got {self.step}")


@dataclass(frozen=True)
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
    def new(
        cls,
        alertname: str,
        steps: tuple[Step, ...],
        now: float,
        trigger: Trigger,
        instances: Mapping[str, AlertSource] | None = None,
    ) -> Ladder:
        return cls(alertname, tuple(steps), now, trigger, instances=dict(instances or {}))

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
        if lad.phase is not Phase.RUNNING:
            return lad
        # The agent stopped while the step ran: it may have acted. Never repeat it;
        # verify its effect as if it had finished now.
        until = now + (lad.current.verify_s if lad.current else 0.0)
        return replace(
            lad, phase=Phase.VERIFY, verify_until=until, run_id=None, outcome=Outcome.INTERRUPTED
        )


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


@dataclass(frozen=True)
class InstanceSeen:
    """An instance of the alert fires (``source``: who told) or resolved (``source`` None)."""

    now: float
    fp: str
    source: AlertSource | None


@dataclass(frozen=True)
class Confirmed:
    """The alert shows up again after an agent restart: the ladder holds no longer."""

    now: float


@dataclass(frozen=True)
class Submitted:
    """The current step's run is under way as ``run_id`` (its Decided comes when it ends)."""

    now: float
    run_id: str


Event = Tick | Decided | InstanceSeen | Confirmed | Submitted


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
    """The ladder after ``ev`` and what to do about it. Pure: a new ladder, the input unchanged."""
    out: list[Decision] = []
    if isinstance(ev, InstanceSeen):
        instances = {k: v for k, v in lad.instances.items() if k != ev.fp}
        if ev.source is not None:
            instances[ev.fp] = ev.source
        return replace(lad, instances=instances), out
    if isinstance(ev, Confirmed):
        return replace(lad, unconfirmed_until=None), out
    if isinstance(ev, Submitted):
        return replace(lad, run_id=ev.run_id), out
    if isinstance(ev, Decided):
        return _decided(lad, ev, retry_s, out), out
    return _tick(lad, ev.now, out), out


def _tick(lad: Ladder, now: float, out: list[Decision]) -> Ladder:
    if lad.phase is Phase.VERIFY:
        if lad.verify_until is not None and now < lad.verify_until:
            return lad
        if lad.outcome == Outcome.SKIPPED_COOLDOWN:
            # It did not run in this ladder: the window was the earlier run's.
            why = f"step {_action(lad)} skipped_cooldown ({lad.skip_why or 'ran recently'}); "
            lad = _leave(
                lad, now, why + "not resolved within the verify window", ran=False, out=out
            )
        else:
            lad = _leave(lad, now, "not resolved within the verify window", ran=True, out=out)
    if lad.phase is not Phase.RUN:
        return lad  # RUNNING: wait for its Decided; EXHAUSTED, BLOCKED: wait for resolution
    if lad.retry_at is not None and now < lad.retry_at:
        return lad
    cur = lad.current
    if cur is None:
        return _end(replace(lad, retry_at=None), out)
    out.append(Submit(cur))
    return replace(lad, retry_at=None, phase=Phase.RUNNING, run_id=None)


def _decided(lad: Ladder, ev: Decided, retry_s: float, out: list[Decision]) -> Ladder:
    cur = lad.current
    if lad.phase is not Phase.RUNNING or cur is None:
        return lad
    o = ev.outcome
    skip_why = ev.error if o is Outcome.SKIPPED_COOLDOWN else None
    lad = replace(lad, run_id=ev.run_id, outcome=o or Outcome.INTERRUPTED, skip_why=skip_why)
    if o is None or o in (Outcome.OK, Outcome.DRY_RUN):
        if cur.action == ActionName.FALLBACK_TO_BASE and o in (Outcome.OK, Outcome.DRY_RUN):
            out.append(HoldRestore(ev.run_id, dict(ev.params)))
        return replace(lad, phase=Phase.VERIFY, verify_until=ev.now + cur.verify_s)
    if o is Outcome.SKIPPED_COOLDOWN:
        # The step ran recently, maybe for another incident (a restart for
        # KcopsEngineDown, then a stall): try it again as the cooldown allows, for one
        # verify window; then leave it as skipped (a verify window that ends now).
        since = ev.now if lad.cooled_since is None else lad.cooled_since
        if ev.now - since < cur.verify_s:
            return replace(lad, cooled_since=since, phase=Phase.RUN, retry_at=ev.now + retry_s)
        return replace(lad, cooled_since=since, phase=Phase.VERIFY, verify_until=ev.now)
    if o in (
        Outcome.SKIPPED_BUSY,
        Outcome.SKIPPED_STARTING,
        Outcome.SKIPPED_OFF,
        Outcome.SKIPPED_NOT_DURABLE,
    ):
        return replace(lad, phase=Phase.RUN, retry_at=ev.now + retry_s)
    if o is Outcome.SKIPPED_BUDGET:
        out.append(Audit("blocked", why=ev.error))
        return replace(lad, phase=Phase.BLOCKED)
    # Not applicable: the next rung, having spent nothing; failed, timeout: it ran.
    ran = not o.not_applicable
    err = ev.error if ran else None
    lad = _leave(lad, ev.now, f"step {cur.action} {o}: {ev.error}", ran=ran, out=out, err=err)
    return _tick(lad, ev.now, out)


def _leave(
    lad: Ladder, now: float, why: str, *, ran: bool, out: list[Decision], err: str | None = None
) -> Ladder:
    cur = lad.current
    left = Left(lad.step, cur.action if cur else None, now, why, ran, lad.outcome, err)
    out.append(Audit("climb" if ran else "skipped", why=why))
    return replace(
        lad,
        history=[*lad.history, left],
        step=lad.step + 1,
        phase=Phase.RUN,
        verify_until=None,
        outcome=None,
        skip_why=None,
        cooled_since=None,
    )


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


def _end(lad: Ladder, out: list[Decision]) -> Ladder:
    """Past the last step: audit what ran, what was skipped and what could not apply,
    and tell a human exactly that (never "ran" for a step that did not)."""
    lad = replace(lad, phase=Phase.EXHAUSTED)
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
        return lad
    if skipped:
        msg += f"; skipped: {'; '.join(skipped)}"
    if refused:
        msg += f"; not applicable: {'; '.join(refused)}"
    out.append(Audit(event, ran=ran, refused=refused, skipped=skipped))
    out.append(Escalate(msg, page=page, severity=lad.severity))
    return lad
