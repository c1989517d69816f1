"""The alert state machine: a pure step, driven by time passed in (no sleeps)."""

from __future__ import annotations

import pytest

from kcops.agent.rules.alerting import Result, step
from kcops.agent.rules.loader import load_rules_data

LAB = (("alertname", "A"), ("x", "1"))


def rule(for_: str = "1m", keep: str = "0s"):  # type: ignore[no-untyped-def]
    doc = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "A",
                        "expr": "up == 0",
                        "for": for_,
                        "keep_firing_for": keep,
                        "remediation": [{"action": "restart_worker", "verify": "30s"}],
                    }
                ],
            }
        ]
    }
    return load_rules_data(doc).alerts()[0]


def run(r, active_at: list[float]) -> list[tuple[float, str, str]]:  # type: ignore[no-untyped-def]
    """Evaluate every 15s up to 300s; the expression returns LAB at the times listed."""
    state: dict = {}
    seen = []
    for i in range(21):
        now = i * 15.0
        results = [Result(LAB, 1.0, {})] if now in active_at else []
        state, trs = step(r, state, results, now)
        seen += [(tr.t, tr.previous, tr.state) for tr in trs]
    return seen


@pytest.mark.parametrize(
    ("for_", "keep", "active", "want"),
    [
        # for counts from the first pending evaluation
        (
            "1m",
            "0s",
            range(30, 151, 15),
            [(30, "inactive", "pending"), (90, "pending", "firing"), (165, "firing", "inactive")],
        ),
        # dropping out while pending never fires
        (
            "1m",
            "0s",
            [30, 45, 60, 105],
            [
                (30, "inactive", "pending"),
                (75, "pending", "inactive"),
                (105, "inactive", "pending"),
                (120, "pending", "inactive"),
            ],
        ),
        # for: 0 fires on the first evaluation
        ("0s", "0s", [30], [(30, "inactive", "firing"), (45, "firing", "inactive")]),
        # keep_firing_for holds a firing alert through a gap shorter than it
        ("0s", "30s", [30, 75, 90], [(30, "inactive", "firing"), (135, "firing", "inactive")]),
        (
            "0s",
            "30s",
            [30, 90],
            [
                (30, "inactive", "firing"),
                (75, "firing", "inactive"),
                (90, "inactive", "firing"),
                (135, "firing", "inactive"),
            ],
        ),
    ],
)
def test_timeline(for_: str, keep: str, active: list[float], want: list) -> None:  # type: ignore[type-arg]
    got = run(rule(for_, keep), [float(t) for t in active])
    assert got == [(float(t), p, s) for t, p, s in want]


def test_transitions_carry_value_annotations_and_the_ladder() -> None:
    r = rule("0s")
    state, trs = step(r, {}, [Result(LAB, 3.5, {"summary": "s"})], 10.0)
    (tr,) = trs
    assert tr.alertname == "A" and tr.labels == dict(LAB) and tr.value == 3.5
    assert tr.annotations == {"summary": "s"}
    assert [s.action for s in tr.remediation] == ["restart_worker"]
    assert tr.remediation[0].verify_s == 30.0
    state2, trs2 = step(r, state, [], 20.0)
    assert state2 == {} and (trs2[0].previous, trs2[0].state) == ("firing", "inactive")


def test_step_does_not_modify_its_input() -> None:
    r = rule("1m")
    state, _ = step(r, {}, [Result(LAB, 1.0, {})], 0.0)
    frozen = dict(state)
    step(r, state, [], 15.0)
    assert state == frozen
