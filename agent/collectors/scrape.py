"""The engine's ``/metrics``, mapped through its kind's adapter to canonical series.

Each tick: fetch (shared poll, timeout shorter than the tick), pick the
engine kind (configured, or detected once from the family names on the page
by the engine registry), pre-filter and parse the families its adapter reads,
and return them under the canonical names (docs/architecture.md#signals) with label
``engine=<kind>``. Raw counter values are passed on as the engine exposes them: a reset
after an engine restart is handled by the rule engine's rate/increase, as in Prometheus.
"""

from __future__ import annotations

from kcops.agent.collectors import promtext
from kcops.agent.collectors.engine_http import EngineClient
from kcops.agent.cost import cost_samples
from kcops.agent.engine import Engine
from kcops.agent.engine.kinds import AUTO, Adapter, EngineKind, EngineRegistry, builtin_kinds
from kcops.agent.samples import Sample
from kcops.errors import CollectorUnavailable


class EngineScrapeCollector:
    name = "engine_scrape"

    def __init__(
        self,
        client: EngineClient,
        adapter: str = AUTO,
        engine: Engine | None = None,
        registry: EngineRegistry | None = None,
        prices: dict[str, float] | None = None,
    ) -> None:
        self.client = client
        self.prices = prices or {}  # per 1,000 context tokens, by model (kcops.agent.cost)
        self.engine = engine
        # The engine's registry when there is an engine: both must know the same kinds.
        self.registry = registry or (engine.registry if engine is not None else builtin_kinds())
        client.want_metrics = True
        self.configured = adapter
        self.kind: EngineKind | None = None
        self._wanted: frozenset[str] = frozenset()
        self._parser = promtext.Parser()
        self._last_body = b""
        self._last_samples: list[Sample] = []
        if adapter != AUTO:
            self._use(self.registry.get(adapter))

    @property
    def adapter(self) -> Adapter | None:
        """The metric adapter in use; None until the kind is known."""
        return self.kind.adapter if self.kind is not None else None

    async def stop(self) -> None:
        await self.client.stop()

    def _use(self, kind: EngineKind) -> None:
        self.kind = kind
        self._parser = promtext.Parser()
        self._wanted = kind.adapter.wanted()
        # A kind with an admin state document reports the engine's pid there.
        self.client.want_state = kind.routes.state is not None

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
        if self.kind is None and self.engine is not None and self.engine.kind is not None:
            self._use(self.engine.kind)  # resolved once, by the engine
        if self.kind is None:
            found = self.registry.detect(promtext.metric_names(text))
            if found is None:
                markers = ", ".join(self.registry.markers()) or "known"
                raise CollectorUnavailable(
                    f"cannot tell the engine from its /metrics (no {markers} families); "
                    "set engine.adapter",
                    reason="unknown_engine",
                )
            self._use(found)
            if self.engine is not None:
                self.engine.learn(found.name)
        assert self.kind is not None
        if body == self._last_body:  # an idle engine serves the same page: parse once
            return list(self._last_samples)
        samples = self.kind.adapter.map(self._parser.parse(text, self._wanted))
        samples += cost_samples(samples, self.prices)
        self._last_body, self._last_samples = body, samples
        return list(samples)
