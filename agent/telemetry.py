"""OpenTelemetry for the agent: action traces and its series as metrics, over OTLP/HTTP.

Both signals go through the SDK's own OTLP/HTTP exporters (their encoding,
retries, timeout, compression and ``OTEL_EXPORTER_OTLP_*`` settings) under ONE
:class:`Resource` built from the standard environment; ``exporters.otlp.service_name``
names the service when the environment does not. The tracer provider is the
app's, not the global one. Metrics are not kept twice in an SDK meter:
:class:`OtlpMetricsPush` reads the store into ``MetricsData``
(:mod:`kcops.agent.otlp_metrics`) and hands it to the exporter. The SDK and
protobuf are imported only when an endpoint is configured, so an agent that does
not export does not pay their RSS.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.trace import NoOpTracerProvider, Tracer

from kcops import __version__
from kcops.agent.config.exporters import OtlpSection

if TYPE_CHECKING:
    from aiohttp import web
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricsData
    from opentelemetry.sdk.resources import Resource

    from kcops.agent.component import AgentContext, Component

log = logging.getLogger("kcops.agent.telemetry")


class Tracing(Protocol):
    """What the app needs of a tracer provider."""

    def get_tracer(self, _module: str, /) -> Tracer: ...

    def force_flush(self, _timeout_millis: int = 30000, /) -> bool: ...

    def shutdown(self) -> None: ...


class Untraced(NoOpTracerProvider):
    """No OTLP endpoint: spans go nowhere, so none are made.

    Without an exporter the SDK's spans were dropped when they ended; not importing the
    SDK (44 modules) saves ~1.5 MiB of the idle agent's RSS.
    """

    def force_flush(self, _timeout_millis: int = 30000, /) -> bool:
        return True  # nothing is ever buffered

    def shutdown(self) -> None:
        pass


RESOURCE_ENV = ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME")


def otel_resource(service_name: str) -> Resource:
    """The agent's one Resource, shared by its spans and its metrics (the same object).

    ``Resource.create`` merges the SDK's defaults (``telemetry.sdk.*``), the detectors of
    ``OTEL_EXPERIMENTAL_RESOURCE_DETECTORS`` and the environment (``OTEL_RESOURCE_ATTRIBUTES``,
    ``OTEL_SERVICE_NAME``); ``service_name`` is used when the environment names no service."""
    return _resource(service_name, *(os.environ.get(k) for k in RESOURCE_ENV))


@functools.cache
def _resource(service_name: str, *_env: str | None) -> Resource:
    from opentelemetry.sdk.resources import (
        SERVICE_NAME,
        SERVICE_VERSION,
        OTELResourceDetector,
        Resource,
    )

    attributes: dict[str, str] = {SERVICE_VERSION: __version__}
    if not OTELResourceDetector().detect().attributes.get(SERVICE_NAME):
        attributes[SERVICE_NAME] = service_name
    return Resource.create(attributes)


def signal_url(cfg: OtlpSection, signal: str) -> str:
    """``<endpoint>/v1/<signal>``: the OTLP/HTTP path of one signal under the configured base."""
    assert cfg.endpoint, "only with an endpoint"
    return cfg.endpoint.rstrip("/") + "/v1/" + signal


def build_tracer_provider(cfg: OtlpSection) -> Tracing:
    """A provider exporting over OTLP/HTTP when ``cfg.endpoint`` is set, else a no-op one."""
    if not cfg.endpoint:
        return Untraced()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=otel_resource(cfg.service_name))
    exporter = OTLPSpanExporter(endpoint=signal_url(cfg, "traces"), timeout=cfg.timeout_s)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class OtlpMetricsPush:
    """A component exporting the store's series to ``<endpoint>/v1/metrics`` on a fixed period.

    One export in flight at a time (in a worker thread: the SDK's exporter blocks, and
    retries within its timeout): a slow collector skips periods rather than piling
    requests up. Failures are counted and logged (1st, 2nd, 4th, ...), never raised
    into the tick.
    """

    name = "otlp_metrics"

    def __init__(self, ctx: AgentContext, started_at: float) -> None:
        cfg = ctx.config.exporters.otlp
        assert cfg.endpoint, "built only with an endpoint"
        self.ctx = ctx
        self.url = signal_url(cfg, "metrics")
        self.interval_s = cfg.metrics_interval_s
        self.timeout_s = cfg.timeout_s
        self.service_name = cfg.service_name
        self.started_at = started_at
        self.last_push: float | None = None
        self.sent = 0
        self.failed = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._exporter: OTLPMetricExporter | None = None

    async def start(self) -> None:
        # Only an agent that exports pays the exporter's import (protobuf, requests).
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        self._exporter = OTLPMetricExporter(endpoint=self.url, timeout=self.timeout_s)

    async def tick(self, now: float) -> None:
        if self.last_push is not None and now - self.last_push < self.interval_s:
            return
        if self._task is not None and not self._task.done():
            return
        self.last_push = now
        from kcops.agent.otlp_metrics import build_metrics_data

        data = build_metrics_data(
            self.ctx.store,
            now,
            started_at=self.started_at,
            stale_after_s=self.ctx.config.store.stale_after_s,
            resource=otel_resource(self.service_name),
            engine_url=self.ctx.config.engine.url,
        )
        self._task = asyncio.create_task(self._export(data))

    async def _export(self, data: MetricsData) -> None:
        from opentelemetry.sdk.metrics.export import MetricExportResult

        assert self._exporter is not None
        timeout_ms = self.timeout_s * 1000
        result = await asyncio.to_thread(self._exporter.export, data, timeout_millis=timeout_ms)
        if result is not MetricExportResult.SUCCESS:
            self.failed += 1
            self.last_error = f"{self.url}: export failed (the exporter's log says why)"
            if self.failed & (self.failed - 1) == 0:
                log.warning("OTLP metrics export #%d failed: %s", self.failed, self.last_error)
            return
        self.sent += 1
        self.last_error = None

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task], timeout=self.timeout_s)
        if self._exporter is not None:
            await asyncio.to_thread(self._exporter.shutdown)

    def status(self) -> dict[str, Any]:
        return {
            "healthy": self.last_error is None,
            "summary": f"{self.sent} exports to {self.url}, {self.failed} failed",
            "error": self.last_error,
        }

    def routes(self) -> list[web.RouteDef]:
        return []


def build_metric_exporters(ctx: AgentContext, started_at: float) -> list[Component]:
    """The OTLP metrics push when ``exporters.otlp.endpoint`` is set and metrics are on."""
    cfg = ctx.config.exporters.otlp
    if not cfg.endpoint or not cfg.metrics:
        return []
    return [OtlpMetricsPush(ctx, started_at)]
