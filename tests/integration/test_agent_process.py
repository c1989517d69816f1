"""`kcops agent run` as a real process: serves /metrics, answers status, stops on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx

from tests.services import free_port, kcops_bin, running, wait_http, wait_until


def test_agent_run_serves_metrics_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    cmd = [
        kcops_bin(),
        "agent",
        "run",
        "--listen",
        f"127.0.0.1:{port}",
        "--state-dir",
        str(tmp_path / "state"),
        "--tick",
        "0.2",
    ]
    with running(cmd, log_path=tmp_path / "agent.log") as proc:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + "/healthz", 60, proc)
        wait_until(lambda: httpx.get(base + "/readyz").status_code == 200, 20, "/readyz 200")
        # The self-metrics collector reports the agent's CPU from its first ticks on.
        wanted = (
            "kcops_agent_tick_seconds_bucket",
            'kcops_process_cpu_seconds_total{process="agent"}',
        )
        wait_until(
            lambda: all(w in httpx.get(base + "/metrics").text for w in wanted),
            20,
            f"{wanted} on /metrics",
        )
        status = subprocess.run(
            [kcops_bin(), "status", "--agent", base], capture_output=True, text=True, timeout=30
        )
        assert status.returncode == 0, status.stderr
        assert "uptime" in status.stdout and "self: ok" in status.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    assert (tmp_path / "state").is_dir()
