"""The reference worker (``kcops serve``): vLLM's names plus ``kcops_worker_*``, a full admin API.

It exposes vLLM's families too, so it is detected before vLLM (its own
``kcops_worker_`` families, or ``GET /admin/state`` answering). Its admin state
reports the worker's pid, which the agent reads when no pid is configured.
"""

from __future__ import annotations

from kcops.agent.engine.kinds.kind import EVICT_POLICIES, EngineKind, EvictRoute, Routes
from kcops.agent.engine.kinds.metrics import COUNTER, GAUGE, HISTOGRAM, Adapter, Map
from kcops.agent.engine.kinds.vllm import VLLM_MAPS

ADAPTER = Adapter(
    name="kcops",
    maps=(
        *VLLM_MAPS,
        Map(
            "kcops_segment_transfer_seconds",
            HISTOGRAM,
            ("kcops_worker_segment_transfer_seconds",),
        ),
        Map("kcops_attention_topn", GAUGE, ("kcops_worker_attention_topn",)),
        Map("kcops_kv_cache_bytes", GAUGE, ("kcops_worker_kv_bytes",)),
        Map("kcops_route_fallback", GAUGE, ("kcops_worker_route_fallback",)),
        Map("kcops_shadow_agreement_ratio", GAUGE, ("kcops_worker_shadow_agreement_ratio",)),
        Map("kcops_shadow_checks", COUNTER, ("kcops_worker_shadow_checks",)),
        # per request, by model and tenant (issue 25): cost is derived from these
        Map(
            "kcops_request_context_tokens",
            HISTOGRAM,
            ("kcops_worker_request_context_tokens",),
        ),
        Map(
            "kcops_request_effective_context_tokens",
            HISTOGRAM,
            ("kcops_worker_request_effective_context_tokens",),
        ),
        Map(
            "kcops_request_priced_effective_tokens",
            COUNTER,
            ("kcops_worker_request_priced_effective_tokens",),
        ),
    ),
    markers=("kcops_worker_",),
    rename_labels={"engine": "engine_index"},
)

KIND = EngineKind(
    adapter=ADAPTER,
    routes=Routes(
        evict=EvictRoute(
            "/admin/cache/evict", policies=frozenset(EVICT_POLICIES), policy_body=True
        ),
        route="/admin/route",
        topn="/admin/attention",
        drain="/admin/drain",
        state="/admin/state",
    ),
    probe="/admin/state",
    programs=("kcops",),
    summary="the reference worker (kcops serve)",
)
