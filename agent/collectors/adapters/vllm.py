"""vLLM (v1 engine) ``/metrics``: names from vllm/v1/metrics/loggers.py.

Deprecated names are second choices: ``vllm:gpu_cache_usage_perc`` (before
``vllm:kv_cache_usage_perc``), ``vllm:gpu_prefix_cache_*`` (before
``vllm:prefix_cache_*``) and ``vllm:time_per_output_token_seconds`` (before
``vllm:inter_token_latency_seconds``). vLLM labels series with ``engine`` (its
engine-core index); that label becomes ``engine_index`` because ``engine`` is
ours (the adapter name).
"""

from __future__ import annotations

from kcops.agent.collectors.adapters.base import COUNTER, GAUGE, HISTOGRAM, Adapter, Map

VLLM_MAPS = (
    Map("kcops_request_latency_seconds", HISTOGRAM, ("vllm:e2e_request_latency_seconds",)),
    Map("kcops_ttft_seconds", HISTOGRAM, ("vllm:time_to_first_token_seconds",)),
    Map(
        "kcops_inter_token_latency_seconds",
        HISTOGRAM,
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    Map(
        "kcops_kv_cache_usage_ratio",
        GAUGE,
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    Map("kcops_requests_waiting", GAUGE, ("vllm:num_requests_waiting",)),
    Map("kcops_requests_running", GAUGE, ("vllm:num_requests_running",)),
    Map(
        "kcops_prefix_cache_queries",
        COUNTER,
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    ),
    Map(
        "kcops_prefix_cache_hits", COUNTER, ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
    ),
)

ADAPTER = Adapter(
    name="vllm",
    maps=VLLM_MAPS,
    markers=("vllm:",),
    rename_labels={"engine": "engine_index"},
)
