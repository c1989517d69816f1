"""The worker's ``/metrics``: vLLM's names and semantics, plus ``kcops_worker_*``.

One private :class:`CollectorRegistry` per worker (no global registry).
Gauges that mirror live state (queue sizes, cache usage, route mode, N) are
read at scrape time from a state callback. The shadow agreement gauge is
absent until a shadow check has run: unknown must not look like 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kcops.exposition import negotiate

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
# vLLM's inter-token latency buckets.
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# Tokens of context per request (full and effective): powers of two, 8 .. 128Ki.
CONTEXT_BUCKETS = tuple(float(2**i) for i in range(3, 18))
TRANSFER_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


@dataclass
class LiveState:
    """Values read at scrape time."""

    waiting: int
    running: int
    kv_cache_usage_perc: float
    top_n: int
    fallback: bool
    shadow_agreement: float | None
    kv_bytes: int | None = None  # KV held by running requests (top-N keeps less)


class _LiveCollector(Collector):
    def __init__(self, model_name: str, read: Callable[[], LiveState]) -> None:
        self._model = model_name
        self._read = read

    def describe(self) -> list[GaugeMetricFamily]:
        # Read live state only at scrape time, not when registering.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        s = self._read()
        lbl = ["model_name"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=lbl)
            g.add_metric([self._model], value)
            return g

        yield gauge("vllm:num_requests_waiting", "Requests waiting to be processed.", s.waiting)
        yield gauge("vllm:num_requests_running", "Requests in model execution.", s.running)
        yield gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            s.kv_cache_usage_perc,
        )
        yield gauge("kcops_worker_attention_topn", "Current default top-N budget.", s.top_n)
        yield gauge(
            "kcops_worker_route_fallback", "1 when all requests go to base.", int(s.fallback)
        )
        if s.kv_bytes is not None:
            yield gauge(
                "kcops_worker_kv_bytes",
                "Bytes of KV cache held by running requests (after top-N retention).",
                s.kv_bytes,
            )
        if s.shadow_agreement is not None:
            yield gauge(
                "kcops_worker_shadow_agreement_ratio",
                "Share of shadow-checked tokens where optimized agrees with full attention.",
                s.shadow_agreement,
            )


class WorkerMetrics:
    def __init__(self, model_name: str, read_live: Callable[[], LiveState]) -> None:
        self.model_name = model_name
        self.registry = r = CollectorRegistry(auto_describe=True)
        lbl = ["model_name"]

        def hist(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, lbl, buckets=buckets, registry=r).labels(model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, lbl, registry=r).labels(model_name)

        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = hist(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        # vLLM's name: one observation per engine step (tokens it scheduled), so the agent
        # counts steps (kcops_engine_iterations_total) for stall detection.
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_BUCKETS,
        )
        self.transfer = hist(
            "kcops_worker_segment_transfer_seconds",
            "Time to bring a cached KV segment back from the Redis tier.",
            TRANSFER_BUCKETS,
        )
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens."
        )
        self.prefix_hits = counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens.")
        self.shadow_checks = counter(
            "kcops_worker_shadow_checks", "Shadow checks of optimized requests."
        )
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*lbl, "finished_reason"],
            registry=r,
        )
        self._routed = Counter(
            "kcops_worker_requests_routed", "Requests by path.", [*lbl, "path"], registry=r
        )
        self._per_request(r)
        r.register(_LiveCollector(model_name, read_live))

    def success(self, finished_reason: str) -> None:
        self._success.labels(self.model_name, finished_reason).inc()

    def _per_request(self, registry: CollectorRegistry) -> None:
        # Per request, labelled by model and by bounded tenant (kcops.tenant).
        by_tenant = ["model", "tenant"]
        self._context = Histogram(
            "kcops_worker_request_context_tokens",
            "Full context of finished requests: prompt + generated tokens.",
            by_tenant,
            buckets=CONTEXT_BUCKETS,
            registry=registry,
        )
        self._effective = Histogram(
            "kcops_worker_request_effective_context_tokens",
            "Effective context of finished requests the probe sampled: mean K_p of their rows.",
            by_tenant,
            buckets=CONTEXT_BUCKETS,
            registry=registry,
        )
        self._priced = Counter(
            "kcops_worker_request_priced_effective_tokens",
            "Effective context tokens as priced: the effective context of sampled requests, "
            "the full context of requests the probe did not sample (no saving claimed).",
            by_tenant,
            registry=registry,
        )

    def request_context(self, tenant: str, full: int, effective: float | None) -> None:
        """One finished request: its full context and, when sampled, its effective context
        (capped at the full context)."""
        self._context.labels(self.model_name, tenant).observe(full)
        if effective is None:
            self._priced.labels(self.model_name, tenant).inc(full)
            return
        eff = min(float(full), effective)
        self._effective.labels(self.model_name, tenant).observe(eff)
        self._priced.labels(self.model_name, tenant).inc(eff)

    def routed(self, path: str) -> None:
        self._routed.labels(self.model_name, path).inc()

    def exposition(self, accept: str | None = None) -> tuple[bytes, str]:
        """The page and its content type, negotiated from the Accept header as vLLM's
        (prometheus-client's) endpoint does: OpenMetrics when asked, else text 0.0.4."""
        encoder, content_type = negotiate(accept)
        return encoder(self.registry), content_type
