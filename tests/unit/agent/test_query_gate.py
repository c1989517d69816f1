"""The query API's bounds: concurrent queries, and its share of the event loop."""

from __future__ import annotations

import pytest

from kcops.agent.query_gate import QueryGate, QueryUnavailable


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
