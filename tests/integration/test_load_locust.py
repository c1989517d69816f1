"""`kcops load` (the `make load` command): Locust headless against the reference worker.

The numbers printed must be Locust's own, read back here from its CSV.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.services import free_port, kcops_bin, running, wait_http, wait_port, wait_until

# Not importorskip: importing locust monkey-patches this process with gevent.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="Locust not installed (extra: load)"
)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    tmp = tmp_path_factory.mktemp("worker")
    cmd = [kcops_bin(), "serve", "--model", "tiny", "--port", str(port), "--long-threshold", "64"]
    with running(cmd, log_path=tmp / "worker.log") as proc:
        wait_port(port, 120, proc)
        yield f"http://127.0.0.1:{port}"


@pytest.mark.slow
def test_load_prints_locust_p99_ttft_and_error_rate(worker: str, tmp_path: Path) -> None:
    env = {**os.environ, "KCOPS_LOAD_PLAIN_EVERY": "2"}
    out = subprocess.run(
        [kcops_bin(), "load", "--host", worker, "--users", "3", "--spawn-rate", "3",
         "--run-time", "25", "--max-tokens", "4", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    from kcops.demo.load.run import read_stats

    stats = read_stats(tmp_path / "locust")
    assert stats.requests() > 0 and stats.failures() == 0
    text = out.stdout
    assert f"p99 latency   {stats.latency_p99_ms():.0f} ms" in text
    by_class = stats.ttft_p99_by_class_ms()
    assert set(by_class) == {"short", "long"}
    assert max(by_class.values()) == stats.ttft_p99_ms()
    ttft = next(ln for ln in text.splitlines() if ln.startswith("TTFT p99"))
    assert ttft == (
        f"TTFT p99      {stats.ttft_p99_ms():.0f} ms (worst class: "
        f"long {by_class['long']:.0f} ms, short {by_class['short']:.0f} ms)"
    )
    assert f"error rate    0.00% of {stats.requests()} requests" in text
    # Plain (non-streamed) answers name their route: the split is in Locust's table.
    assert any("→" in r["Name"] for r in stats.rows), stats.rows
    assert any(r["Type"] == "TTFT" for r in stats.rows)


@pytest.mark.slow
def test_load_reports_the_agents_alerts_during_the_run(worker: str, tmp_path: Path) -> None:
    """AGENT set (`make load AGENT=...`): the alerts a real agent saw during the run are printed.

    The agent watches the worker with a prefix-hit floor of 1.0, which no traffic
    meets (every prompt's last block is computed): the alert is pending under load, once
    its warm-up guard has seen the engine ready for two rate windows.
    """
    port = free_port()
    config = tmp_path / "agent.yaml"
    config.write_text("rules: {params: {cache_hit_ratio: 1.0, rate_window: 10s}}\n")
    agent_cmd = [
        kcops_bin(), "agent", "run", "--listen", f"127.0.0.1:{port}", "--config", str(config),
        "--state-dir", str(tmp_path / "state"), "--engine-url", worker,
        "--engine-adapter", "kcops", "--mode", "dry-run", "--tick", "0.5",
    ]  # fmt: skip
    agent = f"http://127.0.0.1:{port}"
    with running(agent_cmd, log_path=tmp_path / "agent.log") as proc:
        wait_http(agent + "/readyz", 60, proc)
        guard = 'min_over_time(kcops_engine_state{state="ready"}[10s] offset 10s) == 1'

        def guard_open() -> bool:
            got = httpx.get(agent + "/api/v1/query", params={"query": guard}, timeout=10)
            return bool(got.json()["data"]["result"])

        wait_until(guard_open, 60, "the engine ready for a rate window before the current")
        out = subprocess.run(
            [kcops_bin(), "load", "--host", worker, "--agent", agent, "--users", "2",
             "--spawn-rate", "2", "--run-time", "15", "--max-tokens", "2", "--out", str(tmp_path)],
            capture_output=True, text=True, timeout=240,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        seen = httpx.get(agent + "/api/v1/alerts").json()["alerts"]
    text = out.stdout
    assert "agent alerts during the run:" in text, text
    line = re.search(r"^ +\+ *(\d+)s  KcopsPrefixCacheHitRateLow pending$", text, re.M)
    assert line is not None, text
    assert int(line.group(1)) <= 15 + 60  # seen during the run (Locust stops within a minute)
    # What the load printed is what the agent itself reports.
    assert "KcopsPrefixCacheHitRateLow" in {a["alertname"] for a in seen}
