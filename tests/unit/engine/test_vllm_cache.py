"""vLLM's KV cache size from its own figures (issue 31, item 5): ``vllm:cache_config_info``
is an info gauge whose fields are labels; the adapter reads two of them as gauges."""

from __future__ import annotations

import re
from pathlib import Path

from kcops.agent.collectors.promtext import Parser
from kcops.agent.engine.kinds.vllm import ADAPTER

PAGE = (Path(__file__).resolve().parents[2] / "fixtures" / "vllm_metrics.txt").read_text()


def test_cache_config_info_becomes_blocks_and_block_size() -> None:
    info = re.search(r"^vllm:cache_config_info\{(.*)\} ", PAGE, re.M)
    assert info is not None
    labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
    out = ADAPTER.map(Parser().parse(PAGE, ADAPTER.wanted()))
    got = {s.name: s for s in out if s.name.startswith("kcops_kv_cache_block")}
    assert got["kcops_kv_cache_blocks"].value == float(labels["num_gpu_blocks"])
    assert got["kcops_kv_cache_block_tokens"].value == float(labels["block_size"])
    # the info's other fields are not labels of the gauges; vLLM's engine index is
    assert dict(got["kcops_kv_cache_blocks"].labels) == {"engine": "vllm", "engine_index": "0"}


def test_a_field_that_is_not_a_number_leaves_no_sample() -> None:
    page = PAGE.replace('num_gpu_blocks="7281"', 'num_gpu_blocks="None"')
    out = ADAPTER.map(Parser().parse(page, ADAPTER.wanted()))
    names = {s.name for s in out}
    assert "kcops_kv_cache_blocks" not in names and "kcops_kv_cache_block_tokens" in names
