"""Rule groups at runtime: the evaluation grid, ``limit``, and the export of both."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
import yaml

from kcops.agent.rules.engine import RuleEngine
from kcops.agent.rules.export import export_rules
from kcops.agent.rules.group import Group, eval_slot_ms, grid_offset_ms
from kcops.agent.rules.loader import GroupSpec, load_rules_data
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store
from tests.unit.rules.test_component import T0, make_ctx


def _spec(interval: str | None, limit: int | None = None) -> GroupSpec:
    return GroupSpec("g", interval, (), limit)


@pytest.mark.parametrize(
    ("now_ms", "interval_ms", "offset_ms", "slot_ms"),
    [
        (10_000, 5_000, 0, 10_000),  # on a slot: that slot
        (14_999, 5_000, 0, 10_000),  # just before the next one
        (12_000, 5_000, 3_000, 8_000),  # the phase moves the grid
        (13_000, 5_000, 3_000, 13_000),
        (2_999, 5_000, 3_000, -2_000),  # never a slot in the future
        (61_234, 60_000, 59_999, 59_999),
    ],
)
def test_eval_slot_is_the_newest_slot_not_after_now(
    now_ms: int, interval_ms: int, offset_ms: int, slot_ms: int
) -> None:
    assert eval_slot_ms(now_ms, interval_ms, offset_ms) == slot_ms


def test_grid_offset_is_stable_and_inside_the_interval() -> None:
    a = grid_offset_ms("rules.yaml", "g", 5_000)
    assert a == grid_offset_ms("rules.yaml", "g", 5_000)
    assert 0 <= a < 5_000
    offsets = {grid_offset_ms("rules.yaml", f"g{i}", 60_000) for i in range(20)}
    assert len(offsets) > 10  # groups are spread over the interval


def _run(group: Group, ticks: list[float]) -> list[float]:
    return [s for t in ticks if (s := group.due(t)) is not None]


@pytest.mark.parametrize(
    ("interval", "tick_s", "n_ticks", "want_step"),
    [
        ("5s", 1.0, 40, 5.0),
        ("2s", 0.5, 40, 2.0),
        ("1m", 1.0, 200, 60.0),
        ("3s", 1.0, 30, 3.0),
    ],
)
def test_a_group_with_an_interval_runs_every_interval_on_its_grid(
    interval: str, tick_s: float, n_ticks: int, want_step: float
) -> None:
    g = Group(_spec(interval), "rules.yaml", default_interval_s=tick_s)
    ticks = [T0 + 0.37 + i * tick_s for i in range(n_ticks)]
    slots = _run(g, ticks)
    assert len(slots) >= 2
    assert {round(b - a, 6) for a, b in itertools.pairwise(slots)} == {want_step}
    # every slot is on the group's grid, and none is after the tick that ran it
    for s in slots:
        assert round((s - g.offset_s) % want_step, 6) in (0.0, want_step)
    assert slots[0] > ticks[0]  # the first slot after the start, as Prometheus waits
    assert g.missed == 0 and g.iterations == len(slots)


def test_a_group_without_an_interval_runs_on_every_tick_at_the_tick() -> None:
    for interval in (None, "0s"):
        g = Group(_spec(interval), "rules.yaml", default_interval_s=1.0)
        assert g.on_tick and g.interval_s == 1.0
        ticks = [T0 + i for i in range(5)]
        assert _run(g, ticks) == ticks


def test_late_ticks_count_missed_iterations_and_run_the_newest_slot() -> None:
    g = Group(_spec("5s"), "f", default_interval_s=1.0)
    base = T0 + g.offset_s
    assert g.due(base + 1) is None  # the start: waits for the next slot
    assert g.due(base + 5.2) == base + 5
    assert g.due(base + 6) is None
    assert g.due(base + 21) == base + 20  # slots 10 and 15 were missed
    assert (g.missed, g.iterations) == (2, 4)


RULES = {
    "groups": [
        {
            "name": "limited",
            "interval": "5s",
            "limit": 2,
            "rules": [
                {"record": "r:x", "expr": "x"},
                {"alert": "XHigh", "expr": "x > 0", "for": "0s"},
            ],
        }
    ]
}


def _store(n: int, t: float) -> Store:
    store = Store()
    for i in range(n):
        store.append(SeriesKey.of("x", {"i": str(i)}), t, 1.0)
    return store


@pytest.mark.parametrize(
    ("limit", "n", "error"),
    [
        (None, 5, None),
        (0, 5, None),  # 0: no limit, as in Prometheus
        (3, 3, None),
        (2, 3, "exceeded limit of 2 with 3 {what}"),
        (1, 2, "exceeded limit of 1 with 2 {what}"),
    ],
)
def test_limit_fails_the_rule_and_drops_its_output(
    limit: int | None, n: int, error: str | None
) -> None:
    doc = {"groups": [{**RULES["groups"][0], "limit": limit}]}
    ruleset = load_rules_data(doc, "t.yaml")
    store = _store(n, T0)
    engine = RuleEngine(ruleset, store)
    engine.evaluate(T0)
    rec, alert = engine.health["r:x"], engine.health["XHigh"]
    recorded = list(store.keys("r:x"))
    if error is None:
        assert rec.error is None and alert.error is None
        assert len(recorded) == n and len(engine.states["XHigh"]) == n
        return
    assert rec.error == error.format(what="series")
    assert alert.error == error.format(what="alerts")
    assert recorded == []  # nothing of the failed evaluation is written
    assert engine.states["XHigh"] == {} and engine.active() == []
    assert not list(store.keys("ALERTS"))


def test_over_the_limit_drops_alerts_that_were_firing() -> None:
    ruleset = load_rules_data(RULES, "t.yaml")
    store = _store(2, T0)
    engine = RuleEngine(ruleset, store)
    engine.evaluate(T0)
    assert len(engine.states["XHigh"]) == 2
    assert any(i.state == "firing" for i in engine.states["XHigh"].values())
    store.append(SeriesKey.of("x", {"i": "9"}), T0 + 1, 1.0)
    engine.evaluate(T0 + 1)
    assert engine.health["XHigh"].error == "exceeded limit of 2 with 3 alerts"
    assert not any(i.state == "firing" for i in engine.states["XHigh"].values())
    engine.evaluate(T0 + 400)  # x has gone stale: under the limit again
    assert engine.health["XHigh"].error is None


def test_export_keeps_interval_and_limit() -> None:
    ruleset = load_rules_data(RULES, "t.yaml")
    for fmt in ("prometheus", "prometheus-operator"):
        doc = yaml.safe_load(export_rules(ruleset, fmt))
        groups = doc["groups"] if fmt == "prometheus" else doc["spec"]["groups"]
        assert list(groups[0]) == ["name", "interval", "limit", "rules"]
        assert groups[0]["interval"] == "5s" and groups[0]["limit"] == 2


def test_component_evaluates_each_group_on_its_own_interval(tmp_path: Path) -> None:
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {"name": "fast", "rules": [{"record": "r:fast", "expr": "vector(1)"}]},
                    {
                        "name": "slow",
                        "interval": "5s",
                        "rules": [{"record": "r:slow", "expr": "vector(1)"}],
                    },
                ]
            }
        )
    )
    ctx = make_ctx(tmp_path, {"file": str(rule_file)})
    from kcops.agent import rules

    (comp,) = rules.build(ctx)
    seen: dict[str, list[float]] = {"fast": [], "slow": []}

    async def run() -> None:
        for i in range(31):
            await comp.tick(T0 + i)
            for info in comp.groups_info():
                last = info["last_evaluation"]
                if last is not None and last not in seen[info["name"]]:
                    seen[info["name"]].append(last)

    asyncio.run(run())
    assert seen["fast"] == [T0 + i for i in range(31)]
    slow = seen["slow"]
    assert len(slow) == 6
    assert {b - a for a, b in itertools.pairwise(slow)} == {5.0}
    # the recording rule's samples carry the slots
    key = SeriesKey.of("r:slow", {})
    assert ctx.store.latest(key) == (slow[-1], 1.0)
    it = SeriesKey.of("kcops_rule_group_iterations_total", {"rule_group": "slow"})
    assert ctx.store.latest(it) == (slow[-1], 6.0)
