"""A real agent supervising nothing but scraping a real ``kcops serve --model tiny`` with
the probe at full sample rate: before load the live recommendation says it has too few
samples and recommends nothing; after load ``kcops kc recommend`` prints per-layer budgets
with their sample counts, the uniform N beside the worker's configured top-N, and the
gauges appear on the agent's /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.services import free_port, kcops_bin, running, wait_http, wait_until

pytestmark = pytest.mark.slow

MIN_SAMPLES = 40


def complete(worker: str, i: int) -> None:
    prompt = f"Request {i}: the quick brown fox jumps over the lazy dog. " * (3 + i % 4)
    r = httpx.post(
        worker + "/v1/completions",
        timeout=120,
        json={"model": "tiny", "prompt": prompt, "max_tokens": 12},
    )
    r.raise_for_status()


TOKEN = "kc-recommend-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def recommend(agent_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kcops_bin(), "kc", "recommend", "--agent", agent_url, "--refresh", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KCOPS_TOKEN": TOKEN},
    )


def test_live_recommendation_appears_after_load(tmp_path: Path) -> None:
    sock = tmp_path / "probe.sock"
    env = {
        "KCOPS_PROBE_SOCKET": str(sock),
        "KCOPS_PROBE_FLUSH_MS": "100",
        "KCOPS_PROBE_KC_LAYERS_MS": "200",
        "KCOPS_PROBE_SAMPLE_RATE": "1.0",
        "KCOPS_TOKEN": TOKEN,  # ?refresh=1 and the CLI's --refresh need it
    }
    (tmp_path / "agent.yaml").write_text(
        "engine:\n  canary: {enabled: false}\n"
        f"recommendation: {{interval_s: 2s, window_s: 5m, min_samples: {MIN_SAMPLES}}}\n"
    )
    aport, wport = free_port(), free_port()
    agent_url, worker_url = f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{wport}"
    agent_cmd = [
        kcops_bin(), "agent", "run", "--config", str(tmp_path / "agent.yaml"),
        "--listen", f"127.0.0.1:{aport}", "--state-dir", str(tmp_path / "state"),
        "--mode", "off", "--engine-url", worker_url, "--tick", "0.5",
    ]  # fmt: skip
    worker_cmd = [
        kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--threads", "1",
        "--top-n", "32",
    ]  # fmt: skip
    with running(agent_cmd, log_path=tmp_path / "agent.log", env=env) as agent:
        wait_http(agent_url + "/healthz", 30, agent)
        with running(worker_cmd, log_path=tmp_path / "worker.log", env=env) as worker:
            wait_http(worker_url + "/health", 180, worker)
            complete(worker_url, 0)

            def first_samples() -> dict | None:
                doc = httpx.get(
                    agent_url + "/api/v1/kc/recommendation?refresh=1", headers=AUTH, timeout=30
                )
                got = doc.json()
                return got if got["layers"] else None

            doc = wait_until(first_samples, 30, "the first K(C) samples on the agent")
            print("before load:", json.dumps({k: doc[k] for k in ("status", "reason")}))
            assert doc is not None and doc["status"] == "insufficient_samples"
            assert doc["uniform"] is None
            few = recommend(agent_url)
            assert few.returncode == 0, few.stderr
            assert "insufficient_samples" in few.stdout and "uniform N: none" in few.stdout
            assert re.search(r"layer \d+: \d+ of \d+ samples", few.stdout), few.stdout
            assert "first figure: " in few.stdout, few.stdout
            assert "kcops_kc_recommended_n" not in httpx.get(agent_url + "/metrics").text

            for i in range(1, 9):
                complete(worker_url, i)

            def enough() -> dict | None:
                got = httpx.get(
                    agent_url + "/api/v1/kc/recommendation?refresh=1", headers=AUTH, timeout=30
                )
                d = got.json()
                return d if d["status"] == "ok" else None

            doc = wait_until(enough, 60, "a live recommendation")
            assert doc is not None
            samples = {row["layer"]: row["samples"] for row in doc["layers"]}
            print("after load:", samples, "N =", doc["uniform"]["tokens"], doc["uniform"])
            assert set(samples) == {"0", "1"} and min(samples.values()) >= MIN_SAMPLES
            assert doc["calibration"]["status"] == "uncalibrated"
            assert doc["configured"]["top_n"] == 32 and doc["configured"]["model"] == "tiny"
            # tiny's two layers are both dense in the worker: the uniform N covers all
            assert doc["uniform_over"] == "all"
            out = recommend(agent_url)
            print(out.stdout)
            assert out.returncode == 0, out.stderr
            # the CLI's --refresh is a later document (K(C) by layer may still be arriving)
            assert re.search(r"uniform N = \d+ \(interval \(\d+, \d+\]", out.stdout)
            assert "configured: top_n 32" in out.stdout
            for layer in samples:
                assert re.search(rf"\| {layer} \| \d+ \| \d+ \| \(", out.stdout), layer
            assert "capacity (computed" in out.stdout
            metrics = httpx.get(agent_url + "/metrics").text
            assert "kcops_kc_recommended_n " in metrics
            assert 'kcops_kc_recommended_tokens{layer="0"}' in metrics
