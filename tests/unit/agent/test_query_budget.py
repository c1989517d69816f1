"""A real agent refuses a too-expensive query in Prometheus's error shape and keeps serving.

Before the evaluation budget, the nested subquery below held the agent's event
loop for about 45 s: no /healthz, no ticks (audit report 11).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.services import agent_in_thread

NESTED = "max_over_time(max_over_time(vector(1)[1h:1s])[1h:1s])"
# Priced by the series it scans at each of 86,400 steps: known only while it runs.
SCAN = 'count_over_time(count({__name__=~"kcops_.+"})[1d:1s])'


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with agent_in_thread(tmp_path_factory.mktemp("agent"), min_ticks=3) as url:
        yield url


def _error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == kind, body
    return str(body["error"])


def test_nested_subqueries_are_refused_with_422(agent_url: str) -> None:
    r = httpx.get(agent_url + "/api/v1/query", params={"query": NESTED}, timeout=30)
    assert "query too expensive" in _error(r, 422, "execution")


def test_a_range_query_shares_one_budget_over_its_steps(agent_url: str) -> None:
    params = {
        "query": "count_over_time(vector(1)[1h:1s])",
        "start": "0",
        "end": "10000",
        "step": "1",
    }
    r = httpx.get(agent_url + "/api/v1/query_range", params=params, timeout=30)
    assert "a range query of 10001 steps needs at least" in _error(r, 422, "execution")


def test_healthz_answers_while_and_after_an_expensive_query_runs(agent_url: str) -> None:
    with httpx.Client(base_url=agent_url, timeout=60) as client, ThreadPoolExecutor(2) as pool:
        slow = pool.submit(client.get, "/api/v1/query", params={"query": SCAN})
        health = pool.submit(client.get, "/healthz")
        r = slow.result()
        assert health.result().status_code == 200
    # Either bound may end it: the units or, on a slow machine, the deadline.
    if r.status_code == 503:
        assert "timed out" in _error(r, 503, "timeout")
    else:
        assert "more than" in _error(r, 422, "execution")
    assert httpx.get(agent_url + "/healthz").status_code == 200
    ok = httpx.get(agent_url + "/api/v1/query", params={"query": "1 + 1"})
    assert ok.json()["data"]["result"][1] == "2"


@pytest.mark.parametrize(
    "expr",
    [
        " + ".join(["up"] * 200),  # past the bound (5,000 terms overflow the parser's stack)
        "rate(up[18446744073709551616])",  # past a duration's range, it panics
        "(" * 1000 + "1" + ")" * 1000,  # nesting, as deep as a URL can carry
    ],
)
def test_what_would_crash_the_parser_is_a_400_and_the_agent_lives(
    agent_url: str, expr: str
) -> None:
    for path in ("/api/v1/query", "/api/v1/query_range"):
        params = {"query": expr, "start": "0", "end": "60", "step": "15"}
        r = httpx.get(agent_url + path, params=params, timeout=30)
        msg = _error(r, 400, "bad_data")
        assert "too complex" in msg or "out of range" in msg or "at most" in msg, msg
    assert httpx.get(agent_url + "/healthz", timeout=10).status_code == 200


def test_many_parallel_costly_queries_are_bounded_in_prometheus_shape(agent_url: str) -> None:
    # 16 at once: each is evaluated within the API's share of the loop, or refused
    # as unavailable; none answers outside Prometheus's error shape.
    with httpx.Client(base_url=agent_url, timeout=60) as client, ThreadPoolExecutor(16) as pool:
        got = list(
            pool.map(lambda _: client.get("/api/v1/query", params={"query": SCAN}), range(16))
        )
    kinds = {(r.status_code, r.json()["errorType"]) for r in got}
    assert kinds <= {(503, "timeout"), (503, "unavailable"), (422, "execution")}, kinds
    assert httpx.get(agent_url + "/healthz").status_code == 200
