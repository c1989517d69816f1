"""The evaluation budget: one expensive rule or query fails alone, and fails early.

Costs are asserted in work units (deterministic), never in seconds.
"""

from __future__ import annotations

import pytest

from kcops.agent.promql.budget import (
    DEFAULT_MAX_WORK,
    ITEM_UNITS,
    Limits,
    QueryTimeout,
    QueryTooExpensive,
)
from kcops.agent.promql.evaluator import Evaluator
from kcops.agent.promql.parse import parse_expr
from kcops.agent.rules.engine import FAILURES, RuleEngine
from kcops.agent.rules.loader import load_rules_data
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store

# From the audit (report 11): 13 million inner evaluations, about 45 s of CPU
# before the budget existed, with the agent's event loop blocked throughout.
NESTED = "max_over_time(max_over_time(vector(1)[1h:1s])[1h:1s])"


def many_series(n: int = 50, seconds: int = 60) -> Store:
    st = Store(retention_s=1e9)
    for i in range(n):
        key = SeriesKey.of("m", {"i": str(i)})
        for t in range(seconds):
            st.append(key, float(t), float(i))
    return st


def test_nested_subqueries_are_refused_before_any_work() -> None:
    ev = Evaluator(Store(retention_s=1e9))
    with pytest.raises(QueryTooExpensive, match="query too expensive: the expression needs"):
        ev.run(parse_expr(NESTED), 7200.0)
    assert ev.budget.used == 0  # priced from the steps alone: nothing was evaluated


def test_one_level_of_the_same_subquery_fits_and_is_charged() -> None:
    ev = Evaluator(Store(retention_s=1e9))
    out = ev.run(parse_expr("max_over_time(vector(1)[1h:1s])"), 7200.0)
    assert out == [((), 1.0)]
    # 3601 steps, each: the step, vector(1) and its element, the literal 1.
    assert 3601 * 4 * ITEM_UNITS <= ev.budget.used < DEFAULT_MAX_WORK // 10


def test_work_that_cannot_be_priced_beforehand_stops_at_the_budget() -> None:
    # The cost is in the series a regex selector scans at each step, which
    # only the store knows: it fails once the budget is spent.
    ev = Evaluator(many_series(), limits=Limits(max_work=40_000))
    with pytest.raises(QueryTooExpensive, match="more than 40000 units"):
        ev.run(parse_expr('count_over_time(count({__name__=~"m|x"})[1h:1s])'), 60.0)
    assert 40_000 < ev.budget.used <= 40_000 + 50 * ITEM_UNITS * 2
    # The same evaluator runs the next expression under a fresh budget.
    assert ev.run(parse_expr("count(m)"), 60.0) == [((), 50.0)]


def test_range_selectors_charge_a_unit_per_sample() -> None:
    ev = Evaluator(many_series(n=2, seconds=61))
    ev.run(parse_expr("sum_over_time(m[1m])"), 60.0)
    samples = 2 * 61
    assert samples <= ev.budget.used < samples + 20 * ITEM_UNITS


def test_past_the_deadline_the_evaluation_times_out() -> None:
    ev = Evaluator(many_series(), limits=Limits(timeout_s=1e-9))
    with pytest.raises(QueryTimeout, match="query timed out in expression evaluation"):
        ev.run(parse_expr('count_over_time(count({__name__=~"m"})[1h:1s])'), 60.0)


@pytest.mark.parametrize("bad", [{"max_work": 0}, {"timeout_s": 0.0}, {"timeout_s": float("nan")}])
def test_limits_must_be_positive(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="limits must be positive"):
        Limits(**bad)  # type: ignore[arg-type]


def test_an_expensive_rule_fails_alone_counted_and_visible() -> None:
    doc = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"alert": "Costly", "expr": NESTED + " > 0"},
                    {"alert": "Scan", "expr": 'count_over_time(count({i=~".+"})[1h:1s]) > 0'},
                    {"alert": "Cheap", "expr": "m > 40"},
                ],
            }
        ]
    }
    store = many_series()
    engine = RuleEngine(load_rules_data(doc, "t.yaml"), store, limits=Limits(max_work=20_000))
    for t in (50.0, 55.0, 59.0):
        engine.evaluate(t)
    info = {r["name"]: r for r in engine.rules_info()}
    assert info["Costly"]["health"] == "err" and info["Costly"]["errors_total"] == 3
    assert "query too expensive" in info["Costly"]["last_error"]
    assert info["Scan"]["health"] == "err" and "more than 20000 units" in info["Scan"]["last_error"]
    assert info["Cheap"]["health"] == "ok" and info["Cheap"]["active"] == 9
    failures = {
        r: store.latest(SeriesKey.of(FAILURES, {"rule_group": "g", "rule": r}))
        for r in ("Costly", "Scan", "Cheap")
    }
    assert failures == {"Costly": (59.0, 3.0), "Scan": (59.0, 3.0), "Cheap": (59.0, 0.0)}


def test_a_subquery_is_refused_when_what_is_left_cannot_hold_its_steps() -> None:
    ev = Evaluator(many_series(), limits=Limits(max_work=5000))
    # Priced at 2,408 units beforehand; the 3,050 samples read first leave too little.
    expr = parse_expr("sum(sum_over_time(m[1m])) + count_over_time(vector(1)[10m:1s])")
    with pytest.raises(QueryTooExpensive, match="a subquery of 601 steps needs at least 2404"):
        ev.run(expr, 60.0)
    assert ev.budget.used < 5000  # refused before its first step
