"""NVIDIA Triton ``/metrics`` (``nv_inference_*``).

Triton reports the pending request count always and, with
``--metrics-config histogram_latencies=true``, time to first response in
milliseconds (converted here to seconds). Its other latencies are cumulative
microsecond counters, not a histogram, so ``kcops_request_latency_seconds``
stays absent; it counts no tokens or steps, so stall detection does not watch
it. It has no admin route kcops can drive: every action that needs one is refused.
"""

from __future__ import annotations

from kcops.agent.engine.kinds.kind import EngineKind
from kcops.agent.engine.kinds.metrics import GAUGE, HISTOGRAM, Adapter, Map

ADAPTER = Adapter(
    name="triton",
    maps=(
        Map(
            "kcops_ttft_seconds",
            HISTOGRAM,
            ("nv_inference_first_response_histogram_ms",),
            scale=0.001,
        ),
        Map("kcops_requests_waiting", GAUGE, ("nv_inference_pending_request_count",)),
    ),
    markers=("nv_inference_",),
)

KIND = EngineKind(adapter=ADAPTER, programs=("tritonserver",), summary="NVIDIA Triton")
