"""`kcops load` (the `make load` command): Locust headless against the reference worker.

The numbers printed must be Locust's own, read back here from its CSV.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import free_port, kcops_bin, running, wait_port

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
    from kcops.cli.load.run import read_stats

    stats = read_stats(tmp_path / "locust")
    assert stats.requests() > 0 and stats.failures() == 0
    text = out.stdout
    assert f"p99 latency   {stats.latency_p99_ms():.0f} ms" in text
    assert f"TTFT p99      {stats.ttft_p99_ms():.0f} ms" in text
    assert f"error rate    0.00% of {stats.requests()} requests" in text
    # Plain (non-streamed) answers name their route: the split is in Locust's table.
    assert any("→" in r["Name"] for r in stats.rows), stats.rows
    assert any(r["Type"] == "TTFT" for r in stats.rows)
