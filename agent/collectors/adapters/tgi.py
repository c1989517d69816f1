"""Hugging Face TGI ``/metrics`` (router/src: ``tgi_*``).

TGI exposes end-to-end request duration, queue size and current batch size;
it has no time-to-first-token histogram, KV-usage gauge or prefix-cache
counters, so those canonical series stay absent for TGI.
"""

from __future__ import annotations

from kcops.agent.collectors.adapters.base import GAUGE, HISTOGRAM, Adapter, Map

ADAPTER = Adapter(
    name="tgi",
    maps=(
        Map("kcops_request_latency_seconds", HISTOGRAM, ("tgi_request_duration",)),
        Map("kcops_requests_waiting", GAUGE, ("tgi_queue_size",)),
        Map("kcops_requests_running", GAUGE, ("tgi_batch_current_size",)),
    ),
    markers=("tgi_",),
)
