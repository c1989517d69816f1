"""Restore normal routing after a fallback, once its alert stayed resolved for the hold time.

A ``fallback_to_base`` step that ran leaves a :class:`RestoreState` under its
alert's name (``HoldRestore``). :func:`step` is pure: given the entry, whether
the alert is active and the time, it gives the entry back (its ``since``
reset or started) and whether the restore is due. :class:`Restores` carries
that out: it submits ``restore_route`` (forced, with a reason) and drops the
entry once a run of it succeeded (or was a dry run), as the run ends; a failed
or timed-out one is tried again on a later tick.
"""

from __future__ import annotations

from collections.abc import Callable

from kcops.agent.outcome import ActionName, Outcome
from kcops.agent.remediation.records import Trigger
from kcops.agent.remediation.remediation_state import RestoreState
from kcops.agent.remediation.runner import Run, Runner

DONE = (Outcome.OK, Outcome.DRY_RUN)
# A refusal that passes by itself: asked again next tick, not kept as a run.
LATER = (Outcome.SKIPPED_BUSY, Outcome.SKIPPED_STARTING)


def step(entry: RestoreState, *, active: bool, now: float) -> tuple[RestoreState, bool]:
    """(the entry after this tick, whether the restore is due now). Pure."""
    if active:
        if entry.since is None:
            return entry, False
        return entry.model_copy(update={"since": None}), False
    if entry.since is None:
        entry = entry.model_copy(update={"since": now})
    assert entry.since is not None
    return entry, now - entry.since >= entry.hold_s


class Restores:
    """The pending restores, by alert name, and the restore runs in flight."""

    def __init__(self, runner: Runner, on_change: Callable[[], None]) -> None:
        self.runner = runner
        self.on_change = on_change
        self.pending: dict[str, RestoreState] = {}
        self._runs: dict[str, Run] = {}

    def hold(self, alertname: str, run_id: str | None, hold_s: float) -> None:
        self.pending[alertname] = RestoreState(since=None, run_id=run_id, hold_s=hold_s)

    def tick(self, now: float, active: Callable[[str], bool]) -> None:
        for name, entry in list(self.pending.items()):
            if name in self._runs:
                continue  # its run is in flight
            new, due = step(entry, active=active(name), now=now)
            if new != entry:
                self.pending[name] = new
                self.on_change()
            if due:
                self._submit(name, new, now)

    def _submit(self, name: str, entry: RestoreState, now: float) -> None:
        run = self.runner.submit(
            ActionName.RESTORE_ROUTE,
            {},
            now=now,
            trigger=Trigger(alertname=name, resolved_since=entry.since, hold_s=entry.hold_s),
            force=True,
            reason=f"automatic restore: {name} resolved for {entry.hold_s:g}s",
        )
        if run.outcome in LATER:
            return
        if not run.done:
            assert run.task is not None
            self._runs[name] = run
            run.task.add_done_callback(lambda _: self._ended(name, run))
        elif run.outcome in DONE:
            self._drop(name)

    def _ended(self, name: str, run: Run) -> None:
        """A restore run ended: done, or (failed, timed out) the entry stays, tried again."""
        if self._runs.get(name) is run:
            del self._runs[name]
            if run.outcome in DONE:
                self._drop(name)

    def _drop(self, name: str) -> None:
        if self.pending.pop(name, None) is not None:
            self.on_change()
