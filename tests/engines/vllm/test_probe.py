"""The kcops probe inside the real vLLM, seen through the agent: per-layer series labelled
with vLLM's worker name, nothing from processes that never run attention, K(C) samples,
and one INFO line per process in vLLM's log."""

from __future__ import annotations

import re

import pytest

from tests.engines.vllm.harness import Stack, wait_for

pytestmark = pytest.mark.vllm

WORKER = "VLLM::Worker"
LAYERS = 30  # SmolLM2-135M


def _labels(stack: Stack, name: str, label: str) -> set[str]:
    return {dict(lp).get(label, "") for (n, lp) in stack.agent_metrics() if n == name}


def test_series_come_from_the_worker_only_with_every_layer(stack: Stack) -> None:
    calls = "kcops_attention_calls_total"

    def every_layer() -> bool:
        return len(_labels(stack, calls, "layer")) >= LAYERS

    wait_for(every_layer, 120, "attention calls of every layer", stack.log_tail)
    # The API server and the engine core load the plugin but never run attention: they
    # send nothing, so the only process label is the worker's name at send time.
    assert _labels(stack, calls, "process") == {WORKER}
    assert _labels(stack, calls, "layer") >= {str(i) for i in range(LAYERS)}
    assert _labels(stack, "kcops_context_tokens_count", "process") == {WORKER}


def test_kc_tokens_from_vllm(stack: Stack) -> None:
    """K(C) computed inside vLLM from its paged KV cache reaches the agent (probe series
    carry the engine's process name, ``process="VLLM::Worker"``, not an engine label)."""

    def kc_count() -> float:
        m = stack.agent_metrics()
        return sum(
            v
            for (n, lp), v in m.items()
            if n == "kcops_kc_tokens_count" and dict(lp).get("process") == WORKER
        )

    n = wait_for(kc_count, 240, "kcops_kc_tokens samples from vLLM", stack.log_tail)
    m = stack.agent_metrics()
    total = sum(
        v
        for (name, lp), v in m.items()
        if name == "kcops_kc_tokens_sum" and lp == (("process", WORKER),)
    )
    assert total >= n  # K_p >= 1 token per sampled row
    ratio_count = sum(
        v
        for (name, lp), v in m.items()
        if name == "kcops_kc_ratio_count" and dict(lp).get("process") == WORKER
    )
    assert ratio_count > 0
    # the probe's own measuring never failed: no layout error, nothing raised into vLLM
    assert "measuring failed" not in stack.log_path.read_text(errors="replace")


def test_one_info_line_per_process(stack: Stack) -> None:
    text = stack.log_path.read_text(errors="replace")
    found = re.findall(r"^(.*)kcops probe installed \(pid (\d+)\)", text, re.M)
    assert found, "no INFO line from the kcops plugin in vLLM's log"
    pids = [pid for _, pid in found]
    assert len(pids) == len(set(pids)), f"more than one line per process: {found}"
    # vLLM prefixes its lines with the process: the engine core and the worker load the plugin
    prefixes = " ".join(prefix for prefix, _ in found)
    assert "EngineCore" in prefixes and "Worker" in prefixes, found
    assert "not installed in vLLM" not in text
