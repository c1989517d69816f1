"""One rule whose evaluation fails never stops the others: a real `kcops agent run` process.

The agent health-checks a tiny engine stand-in whose ``/health`` the test
switches between 200 and 503, so ``kcops_engine_up`` goes 1 -> 0 -> 1. The
rule file's first rule fails at every evaluation (two series that differ only
by name become one label set, which Prometheus refuses too); the second must
still go pending, fire after its ``for`` and resolve.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.services import free_port, kcops_bin, running, wait_http, wait_until

TICK_S = 0.2
FOR_S = 1.0

RULES = {
    "groups": [
        {
            "name": "isolation",
            "rules": [
                {
                    "alert": "Broken",
                    "expr": '{__name__=~"kcops_engine_up|kcops_engine_last_healthy_age_seconds"}'
                    " * 0",
                },
                {"alert": "EngineDownFast", "expr": "kcops_engine_up == 0", "for": "1s"},
            ],
        }
    ]
}


class Engine:
    """An HTTP server whose /health answers 200 while ``healthy`` is set."""

    def __init__(self) -> None:
        self.healthy = threading.Event()
        self.healthy.set()
        engine = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.path == "/health" and engine.healthy.is_set()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Engine:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[str, Engine]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(RULES))
    port = free_port()
    with Engine() as engine:
        cmd = [
            kcops_bin(),
            "agent",
            "run",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            str(tmp_path / "state"),
            "--tick",
            str(TICK_S),
            "--rules",
            str(rules),
            "--engine-url",
            engine.url,
            "--mode",
            "off",
        ]
        with running(cmd, log_path=tmp_path / "agent.log") as proc:
            base = f"http://127.0.0.1:{port}"
            wait_http(base + "/healthz", 60, proc)
            yield base, engine


def _alert(base: str, name: str) -> dict[str, Any] | None:
    for a in httpx.get(base + "/api/v1/alerts").json()["alerts"]:
        if a["alertname"] == name:
            return a  # type: ignore[no-any-return]
    return None


def _rule(base: str, name: str) -> dict[str, Any]:
    rules = httpx.get(base + "/api/v1/rules").json()["rules"]
    return next(r for r in rules if r["name"] == name)  # type: ignore[no-any-return]


def test_a_failing_rule_leaves_the_next_rule_firing_and_resolving_on_time(
    agent: tuple[str, Engine],
) -> None:
    base, engine = agent
    wait_until(lambda: _rule(base, "EngineDownFast")["health"] == "ok", 30, "the engine up")
    wait_until(lambda: _rule(base, "Broken")["health"] == "err", 30, "the broken rule to fail")
    broken = _rule(base, "Broken")
    assert "same labelset" in broken["last_error"]
    assert _alert(base, "EngineDownFast") is None

    engine.healthy.clear()
    firing = wait_until(
        lambda: (a := _alert(base, "EngineDownFast")) and a["state"] == "firing" and a,
        30,
        "EngineDownFast to fire",
    )
    # Ticks are grid-stamped: firing comes at the first tick >= active_since + for.
    held = firing["fired_at"] - firing["active_since"]
    assert FOR_S - 1e-6 <= held <= FOR_S + TICK_S + 1e-6, held
    engine.healthy.set()
    wait_until(lambda: _alert(base, "EngineDownFast") is None, 30, "EngineDownFast to resolve")

    broken = _rule(base, "Broken")
    assert broken["health"] == "err" and broken["errors_total"] > 5
    metrics = httpx.get(base + "/metrics").text
    line = next(
        ln
        for ln in metrics.splitlines()
        if ln.startswith("kcops_rule_evaluation_failures_total{") and 'rule="Broken"' in ln
    )
    assert 'rule_group="isolation"' in line and float(line.rsplit(" ", 1)[1]) > 5
    ok_line = next(
        ln
        for ln in metrics.splitlines()
        if ln.startswith("kcops_rule_evaluation_failures_total{") and "EngineDownFast" in ln
    )
    assert float(ok_line.rsplit(" ", 1)[1]) == 0


def test_query_api_answers_prometheus_error_json_and_quoted_values(
    agent: tuple[str, Engine],
) -> None:
    base, _ = agent
    wait_until(lambda: _rule(base, "EngineDownFast")["health"] == "ok", 30, "the engine up")
    expr = RULES["groups"][0]["rules"][0]["expr"]  # type: ignore[index]
    r = httpx.get(base + "/api/v1/query", params={"query": expr})
    assert r.status_code == 422
    assert (
        r.json()
        == {
            "status": "error",
            "errorType": "execution",
            "error": r.json()["error"],
        }
        and "same labelset" in r.json()["error"]
    )
    r = httpx.get(base + "/api/v1/query", params={"query": 'up{job=~"a(?=b)"}'})
    assert r.status_code == 400 and r.json()["errorType"] == "bad_data"
    r = httpx.get(base + "/api/v1/query", params={"query": "1", "time": "nan"})
    assert r.status_code == 400 and "time" in r.json()["error"]
    # JSON has no NaN or Infinity: values travel as strings, as Go prints them.
    body = httpx.get(base + "/api/v1/query", params={"query": "0 / 0"}).text
    assert '"NaN"' in body
    two = (
        'label_replace(vector(1/0), "a", "x", "", "") or label_replace(vector(2), "a", "y", "", "")'
    )
    for query, order in [
        (f"sort_desc({two})", [("x", "+Inf"), ("y", "2")]),
        (f"sort({two})", [("y", "2"), ("x", "+Inf")]),
        (f"bottomk(2, {two})", [("y", "2"), ("x", "+Inf")]),
    ]:
        result = httpx.get(base + "/api/v1/query", params={"query": query}).json()["data"]["result"]
        # The engine's order, not re-sorted by labels (as Prometheus's API answers).
        assert [(e["metric"]["a"], e["value"][1]) for e in result] == order, query
