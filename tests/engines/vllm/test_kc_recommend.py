"""The live K(C) budget recommendation on the real vLLM (issue 25): after the soak's light
load, ``kcops kc recommend --agent URL`` prints a budget for every one of SmolLM2's 30
layers with its sample count, the uniform N over them, no configured N (vLLM has no
top-N path) and the capacity figures, all from K(C) the plugin measured in vLLM's paged
KV cache. The agent runs with ``recommendation.min_samples`` = REC_MIN_SAMPLES and the
probe samples PROBE_SAMPLE_RATE of calls (harness.py), so a real recommendation is made
within the soak; nothing here is synthetic."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import httpx
import pytest

from tests.engines.vllm.harness import MAX_MODEL_LEN, MODEL_NAME, REC_MIN_SAMPLES, Stack
from tests.services import kcops_bin, wait_until

pytestmark = pytest.mark.vllm

LAYERS = 30  # SmolLM2-135M
ROUTE = "/api/v1/kc/recommendation"
# the per-request series (not kcops_request_latency_seconds, vLLM's own, mapped)
REQUEST_SERIES = (
    "kcops_request_context_tokens",
    "kcops_request_effective_context_tokens",
    "kcops_request_priced_effective_tokens",
)


def recommend(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kcops_bin(), "kc", "recommend", "--agent", stack.agent_url, "--refresh", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _kc_counts(stack: Stack) -> dict[str, float]:
    return {
        dict(lp)["layer"]: v
        for (n, lp), v in stack.agent_metrics().items()
        if n == "kcops_kc_tokens_count" and dict(lp).get("engine") == "vllm"
    }


def test_kc_recommend_prints_per_layer_budgets_from_vllm(stack: Stack) -> None:
    last: dict[str, Any] = {}

    def recommended() -> dict[str, Any] | None:
        r = httpx.get(f"{stack.agent_url}{ROUTE}?refresh=1", timeout=60)
        r.raise_for_status()
        last.clear()
        last.update(r.json())
        return last if last["status"] == "ok" else None

    def why() -> str:
        return (
            f"{ {k: last.get(k) for k in ('status', 'reason')} }\n"
            f"K(C) counts by layer: {_kc_counts(stack)}\n{stack.log_tail()}"
        )

    doc = wait_until(recommended, 900, "a live recommendation (status ok)", why, interval_s=5.0)
    assert doc is not None
    samples = {row["layer"]: row["samples"] for row in doc["layers"]}
    print("live recommendation:", {r["layer"]: (r["samples"], r["tokens"]) for r in doc["layers"]})
    print("uniform:", doc["uniform"], "capacity:", doc["capacity"])
    assert set(samples) == {str(i) for i in range(LAYERS)}, samples
    assert min(samples.values()) >= REC_MIN_SAMPLES, samples
    # the samples are the probe's K(C) observations that reached the agent: no more than
    # it has counted (the store keeps them all: the window is an hour, the run minutes)
    counts = _kc_counts(stack)
    assert all(samples[layer] <= counts[layer] for layer in samples), (samples, counts)
    for row in doc["layers"]:
        low, high = row["interval"]
        assert 1 <= row["tokens"] <= MAX_MODEL_LEN, row
        assert low < row["tokens"] <= (high if high is not None else MAX_MODEL_LEN), row
        assert not row["dense"] and row["in_uniform"], row  # vLLM reports no dense layers
    budgets = [row["tokens"] for row in doc["layers"]]
    assert len(set(budgets)) > 3, budgets  # a real model: layers differ
    uni = doc["uniform"]
    assert uni["tokens"] == max(budgets) and doc["uniform_over"] == "all", uni
    assert doc["calibration"]["status"] == "uncalibrated"
    assert doc["configured"].get("top_n") is None  # vLLM has no top-N path

    out = recommend(stack)
    print(out.stdout)
    assert out.returncode == 0, out.stderr
    assert "status: ok" in out.stdout
    row = r"^\| (\d+) \| (\d+) \| \d+ \| \(\d+, (?:\d+|inf)\] \|"  # layer, samples, budget
    rows = dict(re.findall(row, out.stdout, re.M))
    assert set(rows) == set(samples), out.stdout  # a budget and a sample count per layer
    assert all(int(rows[layer]) >= REC_MIN_SAMPLES for layer in rows), rows
    assert re.search(r"uniform N = \d+ \(interval \(\d+, (\d+|inf)\], over all layers", out.stdout)
    assert "configured: no top-N budget known" in out.stdout
    assert "capacity (computed" in out.stdout and "usage ratio" in out.stdout

    js = recommend(stack, "--json")
    assert js.returncode == 0, js.stderr
    live = json.loads(js.stdout)["live"]
    assert live["status"] == "ok" and len(live["layers"]) == LAYERS
    assert all(r["samples"] >= REC_MIN_SAMPLES and r["tokens"] >= 1 for r in live["layers"])
    metrics = httpx.get(f"{stack.agent_url}/metrics", timeout=10).text
    assert re.search(r"^kcops_kc_recommended_n \d", metrics, re.M), metrics[-2000:]
    for layer in samples:
        assert f'kcops_kc_recommended_tokens{{layer="{layer}"}}' in metrics, layer


def test_the_worker_attributes_rows_to_vllm_requests(stack: Stack) -> None:
    """The plugin found vLLM's model runner in the worker and wrapped its execute_model
    (kernels/integrations/vllm_requests.py): sampled K(C) rows are attributed to the
    request of their batch entry, and doing so never failed."""
    line = r"kcops probe \(pid \d+\) wrapped ([\w, ]+)\.execute_model: sampled K\(C\) rows"

    def wrapped() -> list[str] | None:
        return re.findall(line, stack.log_path.read_text(errors="replace")) or None

    found = wait_until(wrapped, 300, "the runner's execute_model wrapped", stack.log_tail)
    assert found is not None and len(found) == 1, found  # once, in the worker
    # CPUModelRunner inherits GPUModelRunner's (other subclasses that define their own, if
    # imported, are wrapped too)
    assert "GPUModelRunner" in found[0].split(", "), found
    text = stack.log_path.read_text(errors="replace")
    assert "not attributing K(C) to vLLM requests" not in text
    assert "measuring failed" not in text


def test_effective_context_per_request_from_vllm(stack: Stack) -> None:
    """Finished vLLM requests reach the agent with their full context and, for those the
    probe sampled, their effective context (mean K_p of their rows: attributed through the
    runner's batch, vllm_requests.py), labelled with the served model and tenant
    ``unknown`` (the worker never sees headers). The light load's prompts are ~1570 tokens
    with 24 generated, most of the requests; the agent's canary sends short ones too (it
    serves through the same engine). An effective context is at most its request's."""
    base = (("engine", "vllm"), ("model", MODEL_NAME), ("process", "VLLM::Worker"),
            ("tenant", "unknown"))  # fmt: skip

    def series() -> tuple[dict[str, float], float] | None:
        m = stack.agent_metrics()
        got = {n: v for (n, lp), v in m.items() if n.startswith(REQUEST_SERIES) and lp == base}
        short = max(  # requests under 1,500 tokens of context, from the same scrape
            (
                v
                for (n, lp), v in m.items()
                if n == "kcops_request_context_tokens_bucket"
                and tuple(x for x in lp if x[0] != "le") == base
                and float(dict(lp)["le"]) < 1500
            ),
            default=0.0,
        )
        enough = got.get("kcops_request_effective_context_tokens_count", 0) >= 5
        return (got, short) if enough else None

    seen = wait_until(series, 600, "effective context of 5 sampled vLLM requests", stack.log_tail)
    assert seen is not None
    got, short = seen
    print("per-request series:", got, "under 1,500 tokens:", short)
    queries = got["kcops_request_context_tokens_count"]
    sampled = got["kcops_request_effective_context_tokens_count"]
    full_mean = got["kcops_request_context_tokens_sum"] / queries
    eff_mean = got["kcops_request_effective_context_tokens_sum"] / sampled
    assert sampled <= queries
    # the load's requests (prompt ~1570 + up to 24 tokens) are most; the canary's are short
    assert queries - short >= 5 and queries - short >= 0.75 * queries, (queries, short)
    assert full_mean <= MAX_MODEL_LEN, full_mean
    assert 1 <= eff_mean <= full_mean, (eff_mean, full_mean)
    # priced = effective of the sampled + full of the others: between the two totals
    priced = got["kcops_request_priced_effective_tokens_total"]
    assert got["kcops_request_effective_context_tokens_sum"] <= priced
    assert priced <= got["kcops_request_context_tokens_sum"]
    # every series of the request histograms has exactly these labels
    m = stack.agent_metrics()
    labels = {tuple(x for x in lp if x[0] != "le") for (n, lp) in m if n.startswith(REQUEST_SERIES)}
    assert labels == {base}, labels
