"""OpenTelemetry for the agent: action traces and its series as metrics, over OTLP/HTTP.

The tracer provider is one the app owns, not the global one. Metrics are not
kept twice in an SDK meter: :class:`OtlpMetricsPush` reads the store each
``metrics_interval_s`` and posts one protobuf ``ExportMetricsServiceRequest``
(see :mod:`kcops.agent.otlp_metrics`), so OTLP and ``/metrics`` agree.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry.trace import NoOpTracerProvider, Tracer

from kcops import __version__
from kcops.agent.config.exporters import OtlpSection

if TYPE_CHECKING:
    import httpx
    from aiohttp import web

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


def build_tracer_provider(cfg: OtlpSection) -> Tracing:
    """A provider exporting over OTLP/HTTP when ``cfg.endpoint`` is set, else a no-op one."""
    if not cfg.endpoint:
        return Untraced()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": cfg.service_name, "service.version": __version__})
    )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = OTLPSpanExporter(
        endpoint=cfg.endpoint.rstrip("/") + "/v1/traces", timeout=int(cfg.timeout_s)
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class OtlpMetricsPush:
    """A component posting the store's series to ``<endpoint>/v1/metrics`` on a fixed period.

    One export in flight at a time: a slow collector skips periods rather than
    piling requests up. Failures are counted and logged (1st, 2nd, 4th, ...),
    never raised into the tick.
    """

    name = "otlp_metrics"

    def __init__(self, ctx: AgentContext, started_at: float) -> None:
        cfg = ctx.config.exporters.otlp
        assert cfg.endpoint, "built only with an endpoint"
        self.ctx = ctx
        self.url = cfg.endpoint.rstrip("/") + "/v1/metrics"
        self.interval_s = cfg.metrics_interval_s
        self.timeout_s = cfg.timeout_s
        self.service_name = cfg.service_name
        self.started_at = started_at
        self.last_push: float | None = None
        self.sent = 0
        self.failed = 0
        self.last_error: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None

    async def start(self) -> None:
        import httpx  # only an agent that exports pays its import (~7 MiB of RSS)

        self._http = httpx.AsyncClient(timeout=self.timeout_s)

    async def tick(self, now: float) -> None:
        if self.last_push is not None and now - self.last_push < self.interval_s:
            return
        if self._task is not None and not self._task.done():
            return
        self.last_push = now
        # protobuf and the OTLP messages cost ~6 MiB at import: only an exporting agent pays.
        from kcops.agent.otlp_metrics import build_request

        req = build_request(
            self.ctx.store,
            now,
            started_at=self.started_at,
            stale_after_s=self.ctx.config.store.stale_after_s,
            service_name=self.service_name,
            engine_url=self.ctx.config.engine.url,
        )
        self._task = asyncio.create_task(self._post(req.SerializeToString()))

    async def _post(self, body: bytes) -> None:
        import httpx

        assert self._http is not None
        try:
            resp = await self._http.post(
                self.url, content=body, headers={"Content-Type": "application/x-protobuf"}
            )
            if resp.status_code >= 300:
                raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:200]}")
        except (httpx.HTTPError, RuntimeError) as exc:
            self.failed += 1
            self.last_error = f"{self.url}: {exc}"
            if self.failed & (self.failed - 1) == 0:
                log.warning("OTLP metrics export #%d failed: %s", self.failed, self.last_error)
            return
        self.sent += 1
        self.last_error = None

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            await asyncio.wait([self._task], timeout=self.timeout_s)
        if self._http is not None:
            await self._http.aclose()

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
