"""Issue 25's acceptance, the live recommendation against the offline sweep: a real
``kcops serve --model smollm2`` (the probe at full sample rate, full attention: its
prompts are below --long-threshold) serves the sweep's own corpus (pydoc, the sweep's
chunks at its context) under load, and a real agent calibrated with the sweep's
recommendation.json (tests/fixtures/kc_sweep_smollm2_pydoc_1024, its command beside it)
recommends, live, an N within one step of the sweep's N grid of the sweep's N.

First an uncalibrated agent: with a handful of samples it says ``insufficient_samples``
and ``uncalibrated`` and recommends nothing. Then the calibrated agent on the same probe
socket (the probe reconnects) while the load runs."""

from __future__ import annotations

import json
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services import free_port, kcops_bin, running, wait_http, wait_until

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parents[1] / "fixtures" / "kc_sweep_smollm2_pydoc_1024"
GRID = (32, 64, 128, 256, 512)  # the sweep's --n (COMMAND.md)
CONTEXT, EVAL_TOKENS = 1024, 32  # the sweep's --context and --eval-tokens
PROMPT = CONTEXT - EVAL_TOKENS  # the sweep's prompt: its K(C) rows end here
REQUESTS, CONCURRENT, MAX_TOKENS = 4, 4, 48
MIN_SAMPLES = 150


def sweep_chunks(n: int) -> list[list[int]]:
    """The sweep's first ``n`` sequences of ``CONTEXT + 1`` tokens (kc sweep's chunks)."""
    from kcops.lab.sweep import corpus_text
    from kcops.worker.models import ModelUnavailable, load_tokenizer

    try:
        tok = load_tokenizer(progress=False)
    except ModelUnavailable as exc:
        pytest.skip(str(exc))
    ids = tok(corpus_text("pydoc", 8 * 8 * (CONTEXT + 1)), add_special_tokens=False).input_ids
    return [ids[i * (CONTEXT + 1) : (i + 1) * (CONTEXT + 1)] for i in range(n)]


def complete(worker: str, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    r = httpx.post(
        worker + "/v1/completions",
        timeout=900,
        json={"model": "smollm2", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
    )
    r.raise_for_status()
    return dict(r.json())


TOKEN = "kc-calibration-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def recommendation(agent: str) -> dict[str, Any]:
    got = httpx.get(agent + "/api/v1/kc/recommendation?refresh=1", headers=AUTH, timeout=60)
    got.raise_for_status()
    return dict(got.json())


def agent_cmd(tmp: Path, name: str, port: int, worker_url: str, rec: dict[str, Any]) -> list[str]:
    conf = tmp / f"{name}.yaml"
    conf.write_text(json.dumps({"engine": {"canary": {"enabled": False}}, "recommendation": rec}))
    return [
        kcops_bin(), "agent", "run", "--config", str(conf), "--listen", f"127.0.0.1:{port}",
        "--state-dir", str(tmp / f"state-{name}"), "--mode", "off", "--engine-url", worker_url,
        "--tick", "0.5",
    ]  # fmt: skip


def grid_steps(n: int, sweep_n: int) -> float:
    """How many steps of the sweep's N grid ``n`` lies from ``sweep_n`` (log-linear between
    grid points; beyond the grid's ends, the end steps continued)."""
    import math

    ratio = GRID[1] / GRID[0]  # the grid is doubling
    return abs(math.log(n / sweep_n, ratio))


@pytest.mark.timeout(900)  # five 992-token prefills: ~4 min on 2 cores shared at load 7
def test_calibrated_live_n_is_within_a_grid_step_of_the_sweeps(tmp_path: Path) -> None:
    (sweep,) = json.loads((FIXTURE / "recommendation.json").read_text())
    sweep_n = sweep["n"]
    assert sweep["context"] == CONTEXT and sweep_n in GRID
    cal = tmp_path / "kc-run"  # the agent reads a sweep folder, as an operator points it
    cal.mkdir()
    shutil.copy(FIXTURE / "recommendation.json", cal / "recommendation.json")
    chunks = sweep_chunks(REQUESTS + 1)
    sock = tmp_path / "probe.sock"
    env = {
        "KCOPS_PROBE_SOCKET": str(sock),
        "KCOPS_PROBE_FLUSH_MS": "100",
        "KCOPS_PROBE_KC_LAYERS_MS": "200",
        "KCOPS_PROBE_SAMPLE_RATE": "1.0",
        "KCOPS_TOKEN": TOKEN,  # ?refresh=1 needs it
    }
    wport = free_port()
    worker_url = f"http://127.0.0.1:{wport}"
    base = {"interval_s": "2s", "window_s": "10m", "min_samples": MIN_SAMPLES}
    worker_cmd = [
        kcops_bin(), "serve", "--model", "smollm2", "--port", str(wport), "--threads", "2",
        "--long-threshold", "4096",
    ]  # fmt: skip
    with running(worker_cmd, log_path=tmp_path / "worker.log", env=env) as worker:
        port = free_port()
        plain = f"http://127.0.0.1:{port}"
        cmd = agent_cmd(tmp_path, "plain", port, worker_url, base)
        with running(cmd, log_path=tmp_path / "plain.log", env=env) as agent:
            wait_http(plain + "/healthz", 60, agent)
            wait_http(worker_url + "/health", 300, worker)
            first = complete(worker_url, chunks[REQUESTS][:PROMPT], 1)
            assert first["kcops"]["route"] == "base"  # full attention: K_p is not cut to N

            def some() -> dict[str, Any] | None:
                d = recommendation(plain)
                return d if d["layers"] else None

            few = wait_until(some, 60, "the first K(C) samples on the uncalibrated agent")
            assert few["calibration"]["status"] == "uncalibrated", few["calibration"]
            assert few["status"] == "insufficient_samples" and few["uniform"] is None
            assert str(MIN_SAMPLES) in few["reason"]

        port = free_port()
        calibrated = f"http://127.0.0.1:{port}"
        rec = {**base, "calibration": {"smollm2": {"file": str(cal)}}}
        cmd = agent_cmd(tmp_path, "calibrated", port, worker_url, rec)
        with running(cmd, log_path=tmp_path / "calibrated.log", env=env) as agent:
            wait_http(calibrated + "/healthz", 60, agent)
            prompts = [c[:PROMPT] for c in chunks[:REQUESTS]]
            with ThreadPoolExecutor(CONCURRENT) as pool:
                list(pool.map(lambda p: complete(worker_url, p, MAX_TOKENS), prompts))

            def enough() -> dict[str, Any] | None:
                d = recommendation(calibrated)
                return d if d["status"] == "ok" else None

            doc = wait_until(enough, 60, "a calibrated live recommendation")
            cli = subprocess.run(
                [kcops_bin(), "kc", "recommend", "--agent", calibrated, "--sweep", str(cal)],
                capture_output=True,
                text=True,
                timeout=60,
            )
    print(cli.stdout)
    assert cli.returncode == 0, cli.stderr
    assert "calibrated" in cli.stdout and "(exact, non_dense layers)" in cli.stdout
    cov = doc["calibration"]
    live_n = doc["uniform"]["tokens"]
    samples = min(row["samples"] for row in doc["layers"])
    steps = grid_steps(live_n, sweep_n)
    print(
        f"sweep N={sweep_n}; live calibrated N={live_n} (interval {doc['uniform']['interval']}, "
        f"binding layer {doc['uniform']['binding_layer']}, over {doc['uniform_over']}, "
        f"q={doc['quantile']}, p={doc['p']}, {samples} samples a layer): "
        f"{steps:.2f} grid steps; calibration {json.dumps(cov)}"
    )
    assert cov["status"] == "calibrated" and "N=256" in cov["source"], cov
    assert doc["uniform_over"] == "non_dense"  # the worker keeps layers 0 and 1 dense
    assert "matched over non_dense layers" in cov["source"]
    assert samples >= MIN_SAMPLES
    assert steps <= 1.0, f"live N={live_n} is {steps:.2f} grid steps from the sweep's {sweep_n}"
