"""``POST /api/v1/query`` and ``/api/v1/query_range`` with a form body, as Prometheus takes
them (Grafana's Prometheus data source posts by default): the same answer as GET, open
without the token like every read, the body's parameters before the URL's, and a body
that is not a form refused in Prometheus's error shape."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.services import agent_in_thread

QUERY = "sum by (collector) (kcops_collector_up)"


@pytest.fixture(scope="module")
def agent_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with agent_in_thread(tmp_path_factory.mktemp("agent"), min_ticks=5, token="secret") as url:
        yield url


def test_an_instant_query_posted_as_a_form_answers_as_get(agent_url: str) -> None:
    params = {"query": QUERY, "time": f"{time.time() - 0.2:.3f}"}
    got = httpx.get(agent_url + "/api/v1/query", params=params, timeout=10)
    posted = httpx.post(agent_url + "/api/v1/query", data=params, timeout=10)  # no token
    assert got.status_code == 200 and posted.status_code == 200, (got.text, posted.text)
    assert posted.json() == got.json()
    assert posted.json()["data"]["result"], posted.json()  # something to compare


def test_a_range_query_posted_as_a_form_answers_as_get(agent_url: str) -> None:
    end = time.time() - 0.2
    params = {"query": QUERY, "start": f"{end - 0.4:.3f}", "end": f"{end:.3f}", "step": "0.1"}
    got = httpx.get(agent_url + "/api/v1/query_range", params=params, timeout=10)
    posted = httpx.post(agent_url + "/api/v1/query_range", data=params, timeout=10)
    assert got.status_code == 200 and posted.status_code == 200, (got.text, posted.text)
    assert posted.json() == got.json()
    assert posted.json()["data"]["resultType"] == "matrix"


def test_the_bodys_parameters_come_before_the_urls(agent_url: str) -> None:
    r = httpx.post(
        agent_url + "/api/v1/query",
        params={"query": "vector(1)"},
        data={"query": "vector(2)"},
        timeout=10,
    )
    assert r.status_code == 200, r.text
    assert r.json()["data"]["result"][0]["value"][1] == "2"
    # a POST with no body at all reads the URL, as a GET does
    r = httpx.post(agent_url + "/api/v1/query", params={"query": "vector(3)"}, timeout=10)
    assert r.status_code == 200 and r.json()["data"]["result"][0]["value"][1] == "3", r.text


@pytest.mark.parametrize("path", ["/api/v1/query", "/api/v1/query_range"])
def test_a_body_that_is_not_a_form_is_refused_naming_what_is_allowed(
    agent_url: str, path: str
) -> None:
    r = httpx.post(agent_url + path, json={"query": "vector(1)"}, timeout=10)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["status"] == "error" and body["errorType"] == "bad_data", body
    assert "application/x-www-form-urlencoded" in body["error"], body
    assert "application/json" in body["error"], body


def test_a_posted_form_with_bad_parameters_is_a_400_naming_them(agent_url: str) -> None:
    r = httpx.post(agent_url + "/api/v1/query_range", data={"query": "vector(1)"}, timeout=10)
    assert r.status_code == 400 and "'start'" in r.json()["error"], r.text
    r = httpx.post(agent_url + "/api/v1/query", data={"query": "vector(1)", "time": "x"})
    assert r.status_code == 400 and "'time'" in r.json()["error"], r.text
    r = httpx.post(agent_url + "/api/v1/query", data={"query": "sum("}, timeout=10)
    assert r.status_code == 400 and r.json()["errorType"] == "bad_data", r.text


@pytest.mark.parametrize("body", [b"query=\x80", b"query=%80", b"&".join([b"a=1"] * 65)])
def test_a_form_that_cannot_be_read_is_a_400(agent_url: str, body: bytes) -> None:
    """Bytes or %-escapes that are not UTF-8, too many fields: 400, never a 500."""
    r = httpx.post(
        agent_url + "/api/v1/query",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
        timeout=10,
    )
    assert r.status_code == 400 and r.json()["errorType"] == "bad_data", r.text
    assert "cannot be read" in r.json()["error"], r.text
