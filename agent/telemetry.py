"""OpenTelemetry tracing for the agent: a provider the app owns, not the global one."""

from __future__ import annotations

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from kcops import __version__
from kcops.agent.config.exporters import OtlpSection


def build_tracer_provider(cfg: OtlpSection) -> TracerProvider:
    """A provider exporting over OTLP/HTTP when ``cfg.endpoint`` is set, else recording only."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": cfg.service_name, "service.version": __version__})
    )
    if cfg.endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(
            endpoint=cfg.endpoint.rstrip("/") + "/v1/traces", timeout=int(cfg.timeout_s)
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
