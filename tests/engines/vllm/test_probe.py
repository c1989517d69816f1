"""The kcops probe inside the real vLLM, seen through the agent: per-layer series labelled
with the engine the plugin says it runs in (``engine="vllm"``) and vLLM's worker name,
nothing from processes that never run attention, K(C) samples, and one INFO line per
process in vLLM's log."""

from __future__ import annotations

import re

import pytest

from tests.engines.vllm.harness import POLL_S, Stack
from tests.services import wait_until

pytestmark = pytest.mark.vllm

WORKER = "VLLM::Worker"
PROBE = (("engine", "vllm"), ("process", WORKER))  # the label pairs of every probe series
LAYERS = 30  # SmolLM2-135M


def _labels(stack: Stack, name: str, label: str) -> set[str]:
    return {dict(lp).get(label, "") for (n, lp) in stack.agent_metrics() if n == name}


def test_series_come_from_the_worker_only_with_every_layer(stack: Stack) -> None:
    calls = "kcops_attention_calls_total"

    def every_layer() -> bool:
        return len(_labels(stack, calls, "layer")) >= LAYERS

    wait_until(
        every_layer, 120, "attention calls of every layer", stack.log_tail, interval_s=POLL_S
    )
    # The API server and the engine core load the plugin but never run attention: they
    # send nothing, so the only process label is the worker's name at send time.
    assert _labels(stack, calls, "process") == {WORKER}
    assert _labels(stack, calls, "engine") == {"vllm"}  # stated by the plugin, in the frame
    assert _labels(stack, calls, "layer") >= {str(i) for i in range(LAYERS)}
    assert _labels(stack, "kcops_context_tokens_count", "process") == {WORKER}
    assert _labels(stack, "kcops_context_tokens_count", "engine") == {"vllm"}


def test_kc_tokens_from_vllm(stack: Stack) -> None:
    """K(C) computed inside vLLM from its paged KV cache reaches the agent as
    ``kcops_kc_tokens{engine="vllm", layer=…, process="VLLM::Worker"}``: the engine label
    comes from the plugin, through the frame, so the K(C) panels and ``KcopsKCSurge``
    (``sum by (engine)``) see vLLM by name, and the layer from the call K(C) was sampled in
    (the probe sends K(C) by layer every 10 s)."""

    def by_layer(name: str) -> dict[str, float]:
        return {
            dict(lp)["layer"]: v
            for (n, lp), v in stack.agent_metrics().items()
            if n == name and tuple(x for x in lp if x[0] != "layer") == PROBE
        }

    def kc_count() -> float:
        return sum(by_layer("kcops_kc_tokens_count").values())

    n = wait_until(
        kc_count, 240, 'kcops_kc_tokens{engine="vllm"} samples', stack.log_tail, interval_s=POLL_S
    )
    counts, sums = by_layer("kcops_kc_tokens_count"), by_layer("kcops_kc_tokens_sum")
    assert set(counts) <= {str(i) for i in range(LAYERS)}, counts  # vLLM's layer indices
    assert sum(sums.values()) >= n  # K_p >= 1 token per sampled row
    m = stack.agent_metrics()
    assert m.get(("kcops_kc_ratio_count", PROBE), 0.0) > 0
    # every K(C) series the agent has came from vLLM's worker: no other engine or process
    kc = {tuple(x for x in lp if x[0] != "layer") for (k, lp) in m if k == "kcops_kc_tokens_count"}
    assert kc == {PROBE}
    # the probe's own measuring never failed: no layout error, nothing raised into vLLM
    assert m.get(("kcops_probe_internal_errors_total", PROBE)) == 0
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
    # the line names the engine the probe's frames say (and proves this checkout's plugin ran)
    named = re.findall(r"kcops probe installed \(pid \d+\) for engine vllm:", text)
    assert len(named) == len(found), found
    # the worker's lines name the backend its attention runs through: at install if vLLM
    # had imported it, else when the plugin wrapped it (vLLM imports it after the plugins)
    backend = r"(now: [^)]*CPUAttentionBackendImpl|wrapped CPUAttentionBackendImpl\.forward)"
    assert re.search(r"kcops probe .*" + backend, text), found
