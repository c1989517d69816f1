"""Hostile HTTP bodies and headers against a real agent: a JSON 4xx each, and the agent stays well.

After every input the agent answers /healthz within 1 s and the collectors that were
healthy stay healthy; its log never shows a traceback (checked when it stops).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcops.agent.actions.registry import builtin_actions
from kcops.agent.app import Agent
from kcops.agent.config import parse_config
from kcops.agent.control import core_routes
from kcops.agent.remediation.alertmanager import MAX_LADDER_INSTANCES
from tests.faults.conftest import RealAgent
from tests.faults.fuzzing import Req, bodies, check_answer, hostile_values, query_values, send
from tests.services import wait_until

ROUTES = ("/api/v1/actions/notify", "/api/v1/alertmanager")


def _still_well(agent: RealAgent, healthy: set[str]) -> None:
    assert httpx.get(agent.url + "/healthz", timeout=1.0).status_code == 200
    assert healthy <= agent.healthy_collectors()


def _json_error(resp: httpx.Response) -> None:
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    body = resp.json()  # JSON, never a plain-text or HTML page
    assert "error" in body and "Traceback" not in resp.text


@pytest.mark.parametrize(
    "body,status",
    [
        ({"force": "false"}, 422),
        ({"dry_run": 1}, 422),
        ({"params": []}, 422),
        ({"unknown": True}, 422),
        ([1, 2], 422),
        ("[" * 100_000 + "]" * 100_000, 400),
        ('{"a": "\\ud800"}', 422),
        ("{not json", 400),
        ('{"params": {"n": 1' + "0" * 5000 + "}}", 422),
    ],
)
def test_bad_action_bodies_are_json_4xx(real_agent: RealAgent, body: object, status: int) -> None:
    healthy = real_agent.healthy_collectors()
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(
        real_agent.url + "/api/v1/actions/notify",
        content=content.encode("utf-8", "surrogatepass"),
        headers={**real_agent.headers(), "Content-Type": "application/json"},
        timeout=10,
    )
    if r.status_code != status:
        _json_error(r)  # another 4xx is fine, as long as it is JSON and not a 500
    else:
        _json_error(r)
    _still_well(real_agent, healthy)


def test_non_utf8_authorization_is_401_json(real_agent: RealAgent) -> None:
    r = httpx.post(
        real_agent.url + "/api/v1/actions/notify",
        headers=[(b"Authorization", b"Bearer \xff\xfe\xfd")],
        content=b"{}",
        timeout=5,
    )
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"


def test_unknown_route_and_method_are_json(real_agent: RealAgent) -> None:
    _json_error(httpx.get(real_agent.url + "/nope", timeout=5))
    _json_error(httpx.put(real_agent.url + "/healthz", timeout=5))
    _json_error(
        httpx.post(
            real_agent.url + "/api/v1/alertmanager",
            content=b"x" * (2 << 20),
            headers=real_agent.headers(),
            timeout=10,
        )
    )


def test_webhook_caps(real_agent: RealAgent) -> None:
    alert = {"status": "firing", "labels": {"alertname": "KcopsUnknownFault"}}
    too_many = {"version": "4", "alerts": [alert] * 1001}
    r = httpx.post(
        real_agent.url + "/api/v1/alertmanager",
        json=too_many,
        headers=real_agent.headers(),
        timeout=10,
    )
    # Over the cap: what fits is taken, the rest counted, 200 so Alertmanager keeps what was
    # taken (a 4xx is not retried: all would be lost; tests/faults/test_input_strictness.py).
    assert r.status_code == 200 and r.json()["dropped"] == 1, r.text
    assert "max_alerts" in r.json()["warning"]
    big = {"version": "4", "alerts": [{**alert, "labels": {"alertname": "A", "x": "v" * 5000}}]}
    r = httpx.post(
        real_agent.url + "/api/v1/alertmanager", json=big, headers=real_agent.headers(), timeout=10
    )
    assert r.status_code == 400 and "characters" in r.json()["error"]


class HealthPoller:
    """Asks /healthz with a 1 s client timeout, over and over, until stopped (another thread)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=1.0) as client:
            while not self._stop.is_set():
                try:
                    r = client.get(self.url + "/healthz")
                    if r.status_code == 200:
                        self.answers += 1
                    else:
                        self.failures.append(f"HTTP {r.status_code}")
                except httpx.HTTPError as exc:  # no answer within 1 s: the loop was blocked
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def _storm(name: str, start: int, n: int = 1000) -> dict[str, object]:
    return {
        "version": "4",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": name, "instance": f"pod-{i}", "severity": "ticket"},
                "fingerprint": f"{name}-{i:08x}",
            }
            for i in range(start, start + n)
        ],
    }


def test_a_webhook_storm_keeps_the_loop_answering_and_memory_bounded(
    real_agent: RealAgent,
) -> None:
    """5,000 firing alerts: 2,000 of unknown names, 3,000 distinct instances of one laddered rule.

    The ladder tracks MAX_LADDER_INSTANCES of them and counts the rest; /healthz answers
    within 1 s all along; RSS and the state file stay bounded.
    """
    healthy = real_agent.healthy_collectors()
    rss0 = real_agent.rss_bytes()
    batches = [_storm("KcopsKCSurge", k * 1000) for k in range(3)]
    batches += [_storm(f"Unknown{k}", 0) for k in range(2)]
    with HealthPoller(real_agent.url) as poller:
        for body in batches:
            r = httpx.post(
                real_agent.url + "/api/v1/alertmanager",
                json=body,
                headers=real_agent.headers(),
                timeout=30,
            )
            assert r.status_code == 200 and r.json()["accepted"] == 1000
        # let a tick save the state under the poller too
        wait_until(
            lambda: "KcopsKCSurge" in _remediation(real_agent)["ladders"],
            20,
            "the KcopsKCSurge ladder in /api/v1/remediation",
        )
    assert poller.answers > 0 and not poller.failures, poller.failures[:5]
    rem = _remediation(real_agent)
    lad = rem["ladders"]["KcopsKCSurge"]
    assert len(lad["instances"]) == MAX_LADDER_INSTANCES
    assert rem["instances_refused"] >= 3000 - MAX_LADDER_INSTANCES
    capped = [r for r in _history(real_agent) if r.get("event") == "capped"]
    assert len(capped) == 1  # audited once per ladder, counted every time
    state = real_agent.state_dir / "remediation-state.json"
    wait_until(
        lambda: state.exists() and "KcopsKCSurge-" in state.read_text(),
        20,
        "the ladder's instances in the saved state",
    )
    assert state.stat().st_size < 256 * 1024
    grown = real_agent.rss_bytes() - rss0
    assert grown < 16 << 20, f"RSS grew {grown / 2**20:.1f} MiB during the storm"
    _still_well(real_agent, healthy)


def _remediation(agent: RealAgent) -> dict[str, Any]:
    return dict(httpx.get(agent.url + "/api/v1/remediation", timeout=5).json())


def _history(agent: RealAgent) -> list[dict[str, Any]]:
    r = httpx.get(agent.url + "/api/v1/actions/history?limit=100000", timeout=10)
    return list(r.json()["records"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(route=st.sampled_from(ROUTES), body=json_values | st.binary(max_size=200))
def test_fuzz_bodies(real_agent: RealAgent, route: str, body: object) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(
        real_agent.url + route, content=content, headers=real_agent.headers(), timeout=10
    )
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        _json_error(r)
    assert httpx.get(real_agent.url + "/healthz", timeout=1.0).status_code == 200


# -- every route of the control API ---------------------------------------------------

ACTIONS = builtin_actions().names()
PARAM_KEYS = sorted(
    {k for s in builtin_actions().specs() for k in s.params.model_json_schema()["properties"]}
)
_params = st.dictionaries(st.sampled_from(PARAM_KEYS) | st.text(max_size=8), hostile_values,
                          max_size=3)  # fmt: skip
_alert = st.fixed_dictionaries(
    {},
    optional={
        "status": st.sampled_from(["firing", "resolved", "pending"]),
        "labels": st.dictionaries(
            st.sampled_from(["alertname", "severity", "x"]), st.text(max_size=12), max_size=3
        ),
        "annotations": st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
        "fingerprint": st.text(max_size=20),
        "startsAt": st.sampled_from(["2026-12-01T00:00:00Z", "0001-01-01T00:00:00Z", "nope"]),
    },
)
_queries = st.sampled_from(
    ["up", "kcops_store_series", "1/0", "-1/0", "0/0", "vector(1)", "sum by (x) (up)",
     "rate(kcops_agent_tick_seconds_count[1m])", "max_over_time(kcops_store_series[5m:1m])",
     "absent(nope)", '{__name__=~".+"}', "(" * 3000 + "1" + ")" * 3000, "-" * 5000 + "1",
     "time()", "scalar(up)", "histogram_quantile(0.9, kcops_agent_tick_seconds_bucket)"]
) | st.text(max_size=40)  # fmt: skip


_printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)


def _get(path: str, **query: st.SearchStrategy[str]) -> st.SearchStrategy[Req]:
    q = st.fixed_dictionaries({}, optional=query) if query else st.just({})
    return q.map(lambda qq: Req("GET", path, query=qq))


def _post_form(path: str, **fields: st.SearchStrategy[str]) -> st.SearchStrategy[Req]:
    """A POST whose parameters are a form body (Grafana's default), or not quite one."""
    ctype = st.sampled_from(
        ["application/x-www-form-urlencoded", "application/json", "text/plain", ""]
    )
    body = st.fixed_dictionaries({}, optional=fields).map(lambda f: urlencode(f).encode())
    raw = st.binary(max_size=80)
    return st.tuples(body | raw, ctype).map(
        lambda bc: Req("POST", path, body=bc[0], headers={"Content-Type": bc[1]} if bc[1] else {})
    )


# The query routes' parameters, fuzzed in the URL (GET) and in a form body (POST).
_INSTANT = {"query": _queries, "time": query_values}
_RANGE = {"query": _queries, "start": query_values, "end": query_values, "step": query_values}


AGENT_REQUESTS = st.one_of(
    [
        _get("/healthz"),
        _get("/readyz"),
        _get("/api/v1/status"),
        _get("/api/v1/actions"),
        _get("/api/v1/remediation"),
        _get("/api/v1/alerts"),
        _get("/api/v1/rules"),
        _get("/api/v1/engine/ready"),
        _get("/api/v1/kc/recommendation", refresh=query_values),
        _get("/api/v1/incidents"),
        st.tuples(st.text(max_size=40), st.sampled_from(["", "/export"])).map(
            lambda it: Req("GET", "/api/v1/incidents/" + quote(it[0] or "x", safe="") + it[1])
        ),
        _get("/api/v1/actions/history", since=query_values, limit=query_values),
        _get("/api/v1/query", **_INSTANT),
        _get("/api/v1/query_range", **_RANGE),
        _post_form("/api/v1/query", **_INSTANT),
        _post_form("/api/v1/query_range", **_RANGE),
        _printable.map(lambda a: Req("GET", "/metrics", headers={"Accept": a.strip() or "*/*"})),
        st.tuples(
            st.sampled_from(ACTIONS) | st.text(max_size=12).map(lambda t: t.replace("/", "_")),
            bodies(
                {
                    "params": _params,
                    "force": st.booleans(),
                    "dry_run": st.just(True),
                    "reason": st.text(max_size=30),
                }
            ),
        ).map(lambda nb: Req("POST", "/api/v1/actions/" + quote(nb[0] or "x", safe=""), nb[1])),
        bodies(
            {
                "version": st.sampled_from(["4", 4, "3"]),
                "alerts": st.lists(_alert, max_size=3),
                "status": st.text(max_size=5),
            }
        ).map(lambda b: Req("POST", "/api/v1/alertmanager", body=b)),
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(req=AGENT_REQUESTS)
def test_fuzz_every_route(real_agent: RealAgent, req: Req) -> None:
    """Every read and mutating route: no 5xx, JSON errors, JSON-safe numbers; /healthz after."""
    if req.method == "POST" or req.path.startswith("/api/v1/incidents"):
        req.headers.update(real_agent.headers())  # past the token: the input is what is fuzzed
    with httpx.Client(timeout=10) as client:
        # /api/v1/engine/ready is a readiness answer: 503 while the engine does not serve
        allow = (503,) if req.path == "/api/v1/engine/ready" else ()
        check_answer(send(client, real_agent.url, req), req, allow)
        assert client.get(real_agent.url + "/healthz", timeout=1.0).status_code == 200


def test_every_route_is_fuzzed(tmp_path: Path) -> None:
    """The fuzzer's route list covers what the agent serves (a new route must be added)."""
    served = {
        "/healthz", "/readyz", "/api/v1/status", "/metrics", "/api/v1/actions",
        "/api/v1/actions/history", "/api/v1/remediation", "/api/v1/actions/{name}",
        "/api/v1/alertmanager", "/api/v1/query", "/api/v1/query_range", "/api/v1/alerts",
        "/api/v1/rules", "/api/v1/engine/ready", "/api/v1/kc/recommendation",
        "/api/v1/incidents", "/api/v1/incidents/{id}", "/api/v1/incidents/{id}/export",
    }  # fmt: skip
    agent = Agent(parse_config({"agent": {"state_dir": str(tmp_path)}}), token="t")
    routes = {r.path for r in core_routes(agent)}  # type: ignore[attr-defined]
    for comp in agent.components:
        routes |= {r.path for r in comp.routes()}  # type: ignore[attr-defined]
    assert routes == served
