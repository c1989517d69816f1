"""SGLang: ``/metrics`` (sglang/srt/metrics/collector.py), ``POST /flush_cache``.

SGLang counts prefix-cache reuse as cached prompt tokens: queries are
``sglang:prompt_tokens_total`` and hits ``sglang:cached_tokens_total``, the
same token units vLLM's prefix-cache counters use. ``sglang:token_usage`` is
the KV pool's used share (0..1).

``POST /flush_cache`` drops the whole radix cache. Detected by
``GET /get_server_info`` (asked before vLLM's ``/version``).
"""

from __future__ import annotations

from kcops.agent.engine.kinds.kind import EngineKind, EvictRoute, Routes
from kcops.agent.engine.kinds.metrics import COUNTER, GAUGE, HISTOGRAM, Adapter, Map

ADAPTER = Adapter(
    name="sglang",
    maps=(
        Map("kcops_request_latency_seconds", HISTOGRAM, ("sglang:e2e_request_latency_seconds",)),
        Map("kcops_ttft_seconds", HISTOGRAM, ("sglang:time_to_first_token_seconds",)),
        Map(
            "kcops_inter_token_latency_seconds",
            HISTOGRAM,
            ("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        ),
        Map("kcops_kv_cache_usage_ratio", GAUGE, ("sglang:token_usage",)),
        Map("kcops_requests_waiting", GAUGE, ("sglang:num_queue_reqs",)),
        Map("kcops_requests_running", GAUGE, ("sglang:num_running_reqs",)),
        Map("kcops_prefix_cache_queries", COUNTER, ("sglang:prompt_tokens",)),
        Map("kcops_prefix_cache_hits", COUNTER, ("sglang:cached_tokens",)),
        # Progress (stall detection): SGLang has no engine-step counter.
        Map("kcops_generation_tokens", COUNTER, ("sglang:generation_tokens",)),
        Map("kcops_prompt_tokens", COUNTER, ("sglang:prompt_tokens",)),
    ),
    markers=("sglang:",),
)

KIND = EngineKind(
    adapter=ADAPTER,
    routes=Routes(evict=EvictRoute("/flush_cache")),
    probe="/get_server_info",
    programs=("sglang",),
    summary="SGLang",
)
