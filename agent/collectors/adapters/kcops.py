"""The reference worker (``kcops serve``): vLLM's names plus ``kcops_worker_*``."""

from __future__ import annotations

from kcops.agent.collectors.adapters.base import COUNTER, GAUGE, HISTOGRAM, Adapter, Map
from kcops.agent.collectors.adapters.vllm import VLLM_MAPS

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
    ),
    markers=("kcops_worker_",),
    rename_labels={"engine": "engine_index"},
)
