"""Hugging Face TGI ``/metrics`` (router/src: ``tgi_*``).

TGI exposes end-to-end request duration, queue size and current batch size;
the other canonical series stay absent. It counts no tokens or steps as they
happen (``tgi_request_generated_tokens`` is observed when a request ends), so
stall detection does not watch it. It has no admin route kcops can drive:
every action that needs one is refused.
"""

from __future__ import annotations

from kcops.agent.engine.kinds.kind import EngineKind
from kcops.agent.engine.kinds.metrics import GAUGE, HISTOGRAM, Adapter, Map

ADAPTER = Adapter(
    name="tgi",
    maps=(
        Map("kcops_request_latency_seconds", HISTOGRAM, ("tgi_request_duration",)),
        Map("kcops_requests_waiting", GAUGE, ("tgi_queue_size",)),
        Map("kcops_requests_running", GAUGE, ("tgi_batch_current_size",)),
    ),
    markers=("tgi_",),
)

KIND = EngineKind(
    adapter=ADAPTER, programs=("text-generation-launcher",), summary="Hugging Face TGI"
)
