"""The restore's pure step, table-driven: (entry, active, now) -> (entry, due)."""

from __future__ import annotations

import pytest

from kcops.agent.remediation.remediation_state import RestoreState
from kcops.agent.remediation.restore import step

HOLD = RestoreState(since=None, run_id="r1", hold_s=30.0)
HELD = HOLD.model_copy(update={"since": 10.0})  # resolved since t=10

CASES = [
    # (name, entry, active, now, since after, due)
    ("still active: nothing starts", HOLD, True, 10.0, None, False),
    ("resolved: the hold starts now", HOLD, False, 10.0, 10.0, False),
    ("resolved within the hold: wait", HELD, False, 39.9, 10.0, False),
    ("resolved for the hold: due", HELD, False, 40.0, 10.0, True),
    ("active again: the hold starts over", HELD, True, 20.0, None, False),
    ("no hold: due at once", RestoreState(since=None, hold_s=0.0), False, 5.0, 5.0, True),
]


@pytest.mark.parametrize(
    ("entry", "active", "now", "since", "due"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_step(
    entry: RestoreState, active: bool, now: float, since: float | None, due: bool
) -> None:
    before = entry.model_copy()
    after, is_due = step(entry, active=active, now=now)
    assert entry == before  # pure: the input is untouched
    assert (after.since, is_due) == (since, due)
    assert (after.run_id, after.hold_s) == (entry.run_id, entry.hold_s)
