"""The engine's ``/metrics``, mapped through an adapter to canonical series.

Each tick: fetch (shared poll, timeout shorter than the tick), pick the
adapter (configured, or detected once from the family names on the page),
pre-filter and parse the families the adapter reads, and return them under
DESIGN §3 names with label ``engine=<adapter>``. Raw counter values are
passed on as the engine exposes them: a reset after an engine restart is
handled by the rule engine's rate/increase, like Prometheus does.
"""

from __future__ import annotations

from kcops.agent.collectors import adapters, promtext
from kcops.agent.collectors.adapters import Adapter
from kcops.agent.collectors.engine_http import EngineClient
from kcops.agent.engine import Engine
from kcops.agent.samples import Sample
from kcops.errors import CollectorUnavailable


class EngineScrapeCollector:
    name = "engine_scrape"

    def __init__(
        self, client: EngineClient, adapter: str = "auto", engine: Engine | None = None
    ) -> None:
        self.client = client
        self.engine = engine
        client.want_metrics = True
        self.configured = adapter
        self.adapter: Adapter | None = None if adapter == "auto" else adapters.get(adapter)
        self._wanted: frozenset[str] = frozenset()
        self._parser = promtext.Parser()
        self._last_body = b""
        self._last_samples: list[Sample] = []
        if self.adapter is not None:
            self._use(self.adapter)

    async def stop(self) -> None:
        await self.client.stop()

    def _use(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self._parser = promtext.Parser()
        self._wanted = adapter.wanted()
        self.client.want_state = adapter.name == "kcops"

    async def collect(self, now: float) -> list[Sample]:
        poll = await self.client.poll(now)
        f = poll.metrics
        if f is None:  # pragma: no cover - want_metrics is always set
            return []
        if not f.ok:
            raise CollectorUnavailable(f"engine /metrics: {f.error}", reason=f.reason)
        return self.map_page(f.body, f.content_type)

    def map_page(self, body: bytes, content_type: str = "") -> list[Sample]:
        """Canonical samples from one exposition page (raises :class:`CollectorUnavailable`)."""
        if "html" in content_type or "json" in content_type:
            raise promtext.ExpositionError(
                f"engine /metrics answered {content_type!r}, not Prometheus text"
            )
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            raise promtext.ExpositionError("engine /metrics is not UTF-8 text") from None
        if self.adapter is None and self.engine is not None and self.engine.adapter:
            self._use(adapters.get(self.engine.adapter))  # resolved once, by the engine
        if self.adapter is None:
            found = adapters.detect(promtext.metric_names(text))
            if found is None:
                raise CollectorUnavailable(
                    "cannot tell the engine from its /metrics (no vllm:, sglang:, tgi_, "
                    "nv_inference_ or kcops_worker_ families); set engine.adapter",
                    reason="unknown_engine",
                )
            self._use(found)
            if self.engine is not None:
                self.engine.learn(found.name)
        assert self.adapter is not None
        if body == self._last_body:  # an idle engine serves the same page: parse once
            return list(self._last_samples)
        samples = self.adapter.map(self._parser.parse(text, self._wanted))
        self._last_body, self._last_samples = body, samples
        return list(samples)
