"""Issue 25 acceptance: a real agent scraping a real ``kcops serve --model tiny``; two tenants
(one by the ``X-Tenant`` header, one by OpenAI's ``user``) send requests, and ``kcops cost``
shows both, with a table that adds up; the agent's own canary (issue 39) is served and shows
nowhere in it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.services import free_port, kcops_bin, running, wait_http, wait_until

pytestmark = pytest.mark.slow
PRICE = 0.5  # per 1,000 context tokens
EXPECTED = {"acme": 3.0, "globex": 2.0}  # requests each tenant sends
SAMPLED = "kcops_request_effective_context_tokens_count"


def agent_argv(tmp_path: Path, port: int, engine_url: str) -> list[str]:
    """An agent that only watches (mode off), with tmp_path/agent.yaml's prices."""
    return [
        kcops_bin(), "agent", "run", "--config", str(tmp_path / "agent.yaml"),
        "--listen", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"),
        "--mode", "off", "--engine-url", engine_url, "--tick", "0.5",
    ]  # fmt: skip


def costs(agent_url: str) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(httpx.get(agent_url + "/metrics", timeout=5).text):
        for s in fam.samples:
            if s.name == "kcops_cost_full_total":
                out[(s.labels["tenant"], s.labels["model"])] = s.value
    return out


def finished(
    agent_url: str, metric: str = "kcops_request_context_tokens_count"
) -> dict[str, float]:
    """Finished (or, by ``metric``, sampled) requests by tenant, as the agent's store
    holds them now."""
    expr = f"sum by (tenant) ({metric})"
    body = httpx.get(agent_url + "/api/v1/query", params={"query": expr}, timeout=5).json()
    rows = body.get("data", {}).get("result", []) if body.get("status") == "success" else []
    return {r["metric"].get("tenant", ""): float(r["value"][1]) for r in rows}


def canary_ok(agent_url: str) -> float:
    for fam in text_string_to_metric_families(httpx.get(agent_url + "/metrics", timeout=5).text):
        for s in fam.samples:
            if s.name == "kcops_engine_canary_runs_total" and s.labels["outcome"] == "ok":
                return s.value
    return 0.0


def test_two_tenants_show_in_kcops_cost(tmp_path: Path) -> None:
    aport, wport = free_port(), free_port()
    agent_url, worker_url = f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{wport}"
    (tmp_path / "agent.yaml").write_text(
        "engine:\n  canary: {interval_s: 1}\n"
        f"cost:\n  prices:\n    tiny: {{per_1k_context_tokens: {PRICE}}}\n"
    )
    agent_cmd = agent_argv(tmp_path, aport, worker_url)
    worker_cmd = [kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--threads", "1"]
    # every attention call sampled: every request gets K(C) samples
    env = {"KCOPS_PROBE_SAMPLE_RATE": "1.0", "KCOPS_PROBE_SOCKET": str(tmp_path / "probe.sock")}
    env["KCOPS_TENANT_KEY"] = "shared-by-the-agent-and-its-engine"  # the canary's signature
    sdk = openai.OpenAI(base_url=worker_url + "/v1", api_key="x", max_retries=0, timeout=120)
    with (
        running(agent_cmd, log_path=tmp_path / "agent.log", env=env) as agent,
        running(worker_cmd, log_path=tmp_path / "worker.log", env=env) as worker,
    ):
        wait_http(agent_url + "/healthz", 30, agent)
        wait_http(worker_url + "/health", 180, worker)
        expected = dict(EXPECTED)
        for i in range(100):  # acme's, until the canary ran (only while the engine works)
            if i >= EXPECTED["acme"] and canary_ok(agent_url) >= 1:
                break
            expected["acme"] = i + 1
            sdk.completions.create(
                model="tiny",
                prompt=f"Acme's question number {i}: " + "tell me more. " * 20,
                max_tokens=4,
                temperature=0,
                extra_headers={"X-Tenant": "acme"},
            )
        assert canary_ok(agent_url) >= 1, "the canary never ran"
        for i in range(2):
            sdk.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": f"Globex asks {i}: " + "why? " * 30}],
                max_tokens=4,
                temperature=0,
                user="globex",
            )
        # Every request in the agent's store, not only both tenants' first: the agent
        # scrapes the worker each tick, and a make test once ran `kcops cost` between
        # globex's first request and its second (1 query of 2).
        wait_until(
            lambda: finished(agent_url) == finished(agent_url, SAMPLED) == expected or None,
            30,
            "every request of both tenants in the agent's store",
            lambda: f"{finished(agent_url)} {costs(agent_url)}",
        )
        assert len(costs(agent_url)) == 2, costs(agent_url)
        cli = [kcops_bin(), "cost", "--agent", agent_url, "--since", "10m"]
        out = subprocess.run([*cli, "--json"], capture_output=True, text=True, timeout=60)
        text = subprocess.run(cli, capture_output=True, text=True, timeout=60)
        page = tmp_path / "report.html"
        report = [kcops_bin(), "report", "--agent", agent_url, "--since", "10m", "--out", str(page)]
        reported = subprocess.run(report, capture_output=True, text=True, timeout=120)
        # A day asked of an agent that holds a minute: the answer says what it covers.
        day = [kcops_bin(), "cost", "--agent", agent_url, "--since", "24h"]
        day_text = subprocess.run(day, capture_output=True, text=True, timeout=60)
        day_json = subprocess.run([*day, "--json"], capture_output=True, text=True, timeout=60)
    sdk.close()
    assert day_text.returncode == 0, day_text.stderr
    first = day_text.stdout.splitlines()[0]
    assert first.startswith("window: covers ") and "of the 1d00h asked" in first, first
    assert f"the agent at {agent_url} holds nothing earlier" in first, first
    window = json.loads(day_json.stdout)["window"]
    assert window["partial"] and window["covered_s"] < 3600 and window["asked_s"] >= 86_399
    day_rows = {r["tenant"]: r["queries"] for r in json.loads(day_json.stdout)["rows"]}
    assert day_rows == expected  # the whole of what it holds, nothing lost by the cut
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    print(text.stdout)
    rows = {r["tenant"]: r for r in doc["rows"]}
    assert set(rows) == {"acme", "globex"}  # no row for the canary (tenant "none" before)
    assert {t: r["queries"] for t, r in rows.items()} == expected
    for r in rows.values():
        assert r["sampled"] == r["queries"] and r["measured_share"] == 1  # every call sampled
        # nothing to estimate: the estimate, its interval and the conservative figure agree
        for bound in ("effective_tokens_low", "effective_tokens_high", "conservative_tokens"):
            assert r[bound] == pytest.approx(r["effective_tokens"])
        assert r["cost_conservative"] == pytest.approx(r["cost_effective"])
        assert 0 < r["effective_tokens"] <= r["context_tokens"]
        assert r["cost_full"] == pytest.approx(PRICE * r["context_tokens"] / 1000)
        assert r["cost_effective"] == pytest.approx(PRICE * r["effective_tokens"] / 1000)
        assert r["saving"] == pytest.approx(r["cost_full"] - r["cost_effective"])
    total = doc["total"]
    assert total["cost_full"] == pytest.approx(sum(r["cost_full"] for r in rows.values()))
    assert total["saving"] == pytest.approx(total["cost_full"] - total["cost_effective"])
    assert text.returncode == 0 and "acme" in text.stdout and "globex" in text.stdout
    # the same table as a section of kcops report
    assert reported.returncode == 0, reported.stderr
    html = page.read_text()
    assert "Cost by effective context" in html and "acme" in html and "globex" in html
