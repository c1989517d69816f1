"""The query API's bounds: concurrent queries, and its share of the event loop."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcops.agent.query.gate import QueryGate, QueryUnavailable


def test_past_the_concurrency_limit_a_query_is_refused_and_the_place_comes_back() -> None:
    gate = QueryGate(max_concurrent=2)
    with gate.slot(), gate.slot():
        with (
            pytest.raises(QueryUnavailable, match="too many concurrent queries") as exc,
            gate.slot(),
        ):
            pass
        assert exc.value.reason == "concurrency"
    with gate.slot():
        assert gate.in_flight == 1
    assert gate.refused == {"concurrency": 1, "loop_share": 0}


def test_a_spent_loop_share_refuses_the_next_query_before_it_runs() -> None:
    # A share of a nanosecond per hour: the first evaluation spends it, none refills.
    gate = QueryGate(window_s=3600.0, share_s=1e-9)
    with gate.evaluation() as deadline:
        assert deadline > 0
        sum(range(1000))
    with (
        pytest.raises(QueryUnavailable, match="share of the agent's event loop"),
        gate.evaluation(),
    ):
        pass
    assert gate.refused["loop_share"] == 1


def test_refusals_and_the_bound_are_exported_on_each_tick(tmp_path: Path) -> None:
    import asyncio

    from kcops.agent.query import QueryComponent
    from kcops.agent.samples import SeriesKey
    from tests.unit.rules.test_component import T0, make_ctx

    ctx = make_ctx(tmp_path)
    comp = QueryComponent(ctx)
    comp.gate.max_concurrent = 0
    for _ in range(3):
        with pytest.raises(QueryUnavailable), comp.gate.slot():
            pass
    asyncio.run(comp.tick(T0))

    def value(name: str, **labels: str) -> float | None:
        got = ctx.store.latest(SeriesKey.of(name, labels))
        return None if got is None else got[1]

    assert value("kcops_query_refused_total", reason="concurrency") == 3
    assert value("kcops_query_refused_total", reason="loop_share") == 0
    assert value("kcops_query_max_concurrent") == 0
