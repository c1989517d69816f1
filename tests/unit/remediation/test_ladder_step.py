"""The ladder's pure step, table-driven: (ladder, event) -> (ladder, decisions)."""

from __future__ import annotations

import copy
from dataclasses import FrozenInstanceError, replace
from typing import Any

import pytest

from kcops.agent.events import Step
from kcops.agent.outcome import ActionName, Outcome
from kcops.agent.remediation import ladder as L
from kcops.agent.remediation.records import Trigger

STEPS = (
    Step(ActionName.FALLBACK_TO_BASE, {}, 30.0),
    Step(ActionName.NOTIFY, {"severity": "ticket"}, 60.0),
)


def lad(severity: str = "page", **over: Any) -> L.Ladder:
    trigger = Trigger(labels={"alertname": "A", "severity": severity})
    return replace(L.Ladder.new("A", STEPS, 0.0, trigger), **over)


def kinds(ds: list[L.Decision]) -> list[str]:
    out = []
    for d in ds:
        if isinstance(d, L.Submit):
            out.append(f"submit {d.step.action}")
        elif isinstance(d, L.Audit):
            out.append(f"audit {d.event}")
        elif isinstance(d, L.Escalate):
            out.append("page" if d.page else f"ticket {d.severity}")
        else:
            out.append("hold_restore")
    return out


R = L.Phase.RUNNING
CASES = [
    # (name, ladder overrides, event, phase after, step after, decisions)
    ("first tick submits step 0", {}, L.Tick(1), R, 0, ["submit fallback_to_base"]),
    (
        "ok: verify, hold the restore",
        {"phase": R},
        L.Decided(1, Outcome.OK, "r1"),
        L.Phase.VERIFY,
        0,
        ["hold_restore"],
    ),
    (
        "dry run verifies too",
        {"phase": R},
        L.Decided(1, Outcome.DRY_RUN),
        L.Phase.VERIFY,
        0,
        ["hold_restore"],
    ),
    (
        "cooldown: it ran recently: tried again as the cooldown allows",
        {"phase": R},
        L.Decided(1, Outcome.SKIPPED_COOLDOWN),
        L.Phase.RUN,
        0,
        [],
    ),
    (
        "verify window not over",
        {"phase": L.Phase.VERIFY, "verify_until": 31.0},
        L.Tick(30),
        L.Phase.VERIFY,
        0,
        [],
    ),
    (
        "verify window over: climb, submit next",
        {"phase": L.Phase.VERIFY, "verify_until": 31.0},
        L.Tick(31),
        R,
        1,
        ["audit climb", "submit notify"],
    ),
    (
        "refused: skipped without running, next step now",
        {"phase": R},
        L.Decided(1, Outcome.REFUSED, error="vllm has no route control"),
        R,
        1,
        ["audit skipped", "submit notify"],
    ),
    (
        "failed: it ran, climb now",
        {"phase": R},
        L.Decided(1, Outcome.FAILED, error="boom"),
        R,
        1,
        ["audit climb", "submit notify"],
    ),
    ("busy: retry later", {"phase": R}, L.Decided(1, Outcome.SKIPPED_BUSY), L.Phase.RUN, 0, []),
    (
        "starting: retry later",
        {"phase": R},
        L.Decided(1, Outcome.SKIPPED_STARTING),
        L.Phase.RUN,
        0,
        [],
    ),
    ("retry not due", {"retry_at": 5.0}, L.Tick(4), L.Phase.RUN, 0, []),
    (
        "budget: blocked",
        {"phase": R},
        L.Decided(1, Outcome.SKIPPED_BUDGET),
        L.Phase.BLOCKED,
        0,
        ["audit blocked"],
    ),
    ("running: waits for its outcome", {"phase": R}, L.Tick(9), R, 0, []),
    ("lost run after a restart: verify", {"phase": R}, L.Decided(1, None), L.Phase.VERIFY, 0, []),
    (
        "all refused, page alert: no applicable remediation, paged",
        {
            "phase": R,
            "step": 1,
            "history": [L.Left(0, "fallback_to_base", 0, "x", ran=False)],
        },
        L.Decided(1, Outcome.REFUSED, error="actions.notify.url is not configured"),
        L.Phase.EXHAUSTED,
        2,
        ["audit skipped", "audit no_applicable_remediation", "page"],
    ),
    (
        "a step ran, the rest refused: exhausted",
        {
            "phase": R,
            "step": 1,
            "history": [L.Left(0, "fallback_to_base", 0, "x", ran=True)],
        },
        L.Decided(1, Outcome.REFUSED, error="no url"),
        L.Phase.EXHAUSTED,
        2,
        ["audit skipped", "audit exhausted", "page"],
    ),
    (
        "exhausted waits for resolution",
        {"phase": L.Phase.EXHAUSTED, "step": 2},
        L.Tick(99),
        L.Phase.EXHAUSTED,
        2,
        [],
    ),
]


@pytest.mark.parametrize(
    ("over", "ev", "phase", "step", "want"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_step(
    over: dict[str, Any], ev: L.Event, phase: L.Phase, step: int, want: list[str]
) -> None:
    before = lad(**over)
    snapshot = copy.deepcopy(before)
    after, decisions = L.step(before, ev, retry_s=5.0)
    assert before == snapshot  # pure: the input is untouched
    assert (after.phase, after.step, kinds(decisions)) == (phase, step, want)


def test_a_ticket_alert_never_pages_and_never_reads_past_its_last_step() -> None:
    lad0 = lad("ticket", phase=R, step=1)
    after, decisions = L.step(lad0, L.Decided(1, Outcome.REFUSED, error="no url"), retry_s=5)
    assert kinds(decisions)[-1] == "ticket ticket"
    esc = decisions[-1]
    assert isinstance(esc, L.Escalate) and "no applicable remediation" in esc.message
    assert after.ref().step == 1 and after.ref().of == 2  # never "step 2/1"


def test_what_the_driver_learns_goes_in_as_an_event_and_comes_back_a_new_ladder() -> None:
    base = lad(unconfirmed_until=9.0)
    joined, _ = L.step(base, L.InstanceSeen(1, "fp", "alertmanager"), retry_s=5)
    confirmed, _ = L.step(joined, L.Confirmed(2), retry_s=5)
    running, ds = L.step(confirmed, L.Submitted(3, "run-1"), retry_s=5)
    gone, _ = L.step(running, L.InstanceSeen(4, "fp", None), retry_s=5)
    assert base.instances == {} and base.unconfirmed_until == 9.0 and base.run_id is None
    assert joined.instances == {"fp": "alertmanager"} and confirmed.unconfirmed_until is None
    assert running.run_id == "run-1" and ds == [] and gone.instances == {}
    with pytest.raises(FrozenInstanceError):
        base.run_id = "x"  # type: ignore[misc]
