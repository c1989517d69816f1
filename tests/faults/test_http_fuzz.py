"""Hostile HTTP bodies and headers against a real agent: a JSON 4xx each, and the agent stays well.

After every input the agent answers /healthz within 1 s and the collectors that were
healthy stay healthy; its log never shows a traceback (checked when it stops).
"""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.faults.conftest import RealAgent

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
    assert r.status_code == 413 and "max_alerts" in r.json()["error"]
    big = {"version": "4", "alerts": [{**alert, "labels": {"alertname": "A", "x": "v" * 5000}}]}
    r = httpx.post(
        real_agent.url + "/api/v1/alertmanager", json=big, headers=real_agent.headers(), timeout=10
    )
    assert r.status_code == 400 and "characters" in r.json()["error"]


def test_a_storm_of_unknown_alerts_keeps_the_loop_answering(real_agent: RealAgent) -> None:
    healthy = real_agent.healthy_collectors()
    alerts = [
        {
            "status": "firing",
            "labels": {"alertname": f"Unknown{i}", "i": str(i)},
            "fingerprint": f"f{i}",
        }
        for i in range(1000)
    ]
    r = httpx.post(
        real_agent.url + "/api/v1/alertmanager",
        json={"version": "4", "alerts": alerts},
        headers=real_agent.headers(),
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["accepted"] == 1000
    _still_well(real_agent, healthy)


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
