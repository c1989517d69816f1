"""The ``/metrics`` format both the agent and the worker answer in, negotiated from Accept.

prometheus-client's :func:`choose_encoder` picks the format: OpenMetrics when asked for
it, else the text format 0.0.4. Under OpenMetrics it escapes names with ``underscores``
unless told otherwise, and prometheus-client 0.26 does that unevenly: a name with a colon
(vLLM's ``vllm:e2e_request_latency_seconds``, a recording rule's ``job:x:rate5m``) keeps
it on its ``# HELP`` and ``# TYPE`` lines but loses it on its samples, so a strict parser
reads metadata with no samples and samples with no type (client_python issue #1177).

Every name either page carries is a legacy Prometheus name (``[a-zA-Z_:][a-zA-Z0-9_:]*``:
the agent admits no other, the worker has fixed names), which every escaping scheme
leaves as it is. So the page is written unescaped, the same name on every line, under
the content type that was negotiated.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from prometheus_client.exposition import choose_encoder
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

OPENMETRICS = "application/openmetrics-text"

Encoder = Callable[[Collector], bytes]


def negotiate(accept: str | None) -> tuple[Encoder, str]:
    """The encoder and the content type to answer ``accept`` with."""
    encoder, content_type = choose_encoder(accept or "")
    if not content_type.startswith(OPENMETRICS):
        return encoder, content_type
    version = "1.0.0"
    for param in content_type.split(";")[1:]:
        key, _, value = param.strip().partition("=")
        if key == "version":
            version = value
    writer = partial(openmetrics.generate_latest, escaping=openmetrics.ALLOWUTF8, version=version)
    return writer, content_type
