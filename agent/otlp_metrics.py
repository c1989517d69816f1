"""The agent's series as OpenTelemetry SDK ``MetricsData``, for the SDK's OTLP exporter.

Built from the store directly, as ``/metrics`` is, so both show the same
values: each series' newest sample unless older than ``stale_after_s``.
Histograms keep their buckets (cumulative ``le`` counts become explicit-bucket
counts); counters are cumulative monotonic sums.

Where OpenTelemetry has a semantic convention, the series is exported under
its name, unit and required attributes: ``hw.gpu.*`` for a GPU (never for a
CPU engine's memory cgroup), ``gen_ai.server.*`` for the serving latencies.
Everything else keeps its Prometheus family name and labels.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from kcops import __version__
from kcops.agent.exporter import family_of, safe_text
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store


@dataclass(frozen=True)
class SemConv:
    """An OpenTelemetry semantic-convention name for one kcops family."""

    name: str
    unit: str
    extra: tuple[tuple[str, str], ...] = ()
    rename: tuple[tuple[str, str], ...] = ()  # Prometheus label -> convention attribute
    gen_ai: bool = False  # a gen_ai.server.* metric: its required attributes are added


GPU = (("hw.type", "gpu"),)
HW_ID = (("device", "hw.id"),)
# gen_ai.server.*: the engine (the adapter that read it) is the provider; vLLM's
# model_name label is the model. The agent sees the engine's histograms summed
# over completions and chat: the operation is text completion.
GEN_AI = (("engine", "gen_ai.provider.name"), ("model_name", "gen_ai.request.model"))
OPERATION = "text_completion"
SEMCONV: dict[str, SemConv] = {
    "kcops_device_memory_used_bytes": SemConv("hw.gpu.memory.usage", "By", GPU, HW_ID),
    "kcops_device_memory_total_bytes": SemConv("hw.gpu.memory.limit", "By", GPU, HW_ID),
    "kcops_gpu_utilization_ratio": SemConv("hw.gpu.utilization", "1", GPU, HW_ID),
    "kcops_gpu_temperature_celsius": SemConv("hw.temperature", "Cel", GPU, HW_ID),
    "kcops_gpu_power_watts": SemConv("hw.power", "W", GPU, HW_ID),
    "kcops_ttft_seconds": SemConv(
        "gen_ai.server.time_to_first_token", "s", rename=GEN_AI, gen_ai=True
    ),
    "kcops_inter_token_latency_seconds": SemConv(
        "gen_ai.server.time_per_output_token", "s", rename=GEN_AI, gen_ai=True
    ),
    "kcops_request_latency_seconds": SemConv(
        "gen_ai.server.request.duration", "s", rename=GEN_AI, gen_ai=True
    ),
}
CPU_DEVICE = "cpu"  # a CPU engine's "device" is its memory cgroup, not a GPU


def convention(family: str, labels: Iterable[tuple[str, str]]) -> SemConv | None:
    """The convention a series is exported under, or None (its Prometheus name)."""
    conv = SEMCONV.get(family)
    if conv is not None and conv.extra == GPU and dict(labels).get("device") == CPU_DEVICE:
        return None
    return conv


def server_attributes(engine_url: str | None) -> dict[str, str]:
    """``server.address`` and ``server.port`` of the engine's URL ({} without one)."""
    if not engine_url:
        return {}
    parts = urlsplit(engine_url)
    if not parts.hostname:
        return {}
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname, "server.port": str(port)}


def _unit_of(family: str) -> str:
    for suffix, unit in (("_seconds", "s"), ("_bytes", "By"), ("_ratio", "1")):
        if family.endswith(suffix):
            return unit
    return ""


def _attrs(
    labels: Iterable[tuple[str, str]], conv: SemConv | None, server: Mapping[str, str]
) -> dict[str, str | int]:
    pairs = dict(labels)
    if conv is not None:
        rename = dict(conv.rename)
        pairs = {rename.get(k, k): v for k, v in pairs.items()}
        pairs.update(conv.extra)
        if conv.gen_ai:
            pairs.setdefault("gen_ai.provider.name", "unknown")
            pairs["gen_ai.system"] = pairs["gen_ai.provider.name"]  # semconv <= 1.36
            pairs["gen_ai.operation.name"] = OPERATION
            if "gen_ai.request.model" in pairs:
                pairs["gen_ai.response.model"] = pairs["gen_ai.request.model"]
            pairs.update(server)
    return dict(_kv(k, v) for k, v in sorted(pairs.items()))


def _kv(key: str, value: str) -> tuple[str, str | int]:
    if key == "server.port":  # an int attribute in the convention
        return key, int(value)
    # protobuf refuses text UTF-8 cannot encode: escape it rather than lose the batch
    return safe_text(key), safe_text(value)


@dataclass
class _Hist:
    bounds: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    count: float = math.nan
    total: float = math.nan


def _latest(store: Store, now: float, stale_after_s: float) -> dict[SeriesKey, float]:
    out = {}
    for key in store.keys(None):
        got = store.latest(key, at=now, lookback_s=stale_after_s)
        if got is not None:
            out[key] = got[1]
    return out


def _histogram_points(
    fam: str,
    series: dict[SeriesKey, float],
    start_ns: int,
    now_ns: int,
    conv: SemConv | None,
    server: Mapping[str, str],
) -> list[HistogramDataPoint]:
    groups: dict[tuple[tuple[str, str], ...], _Hist] = {}
    for key, value in series.items():
        base = tuple((k, v) for k, v in key.labels if k != "le")
        h = groups.setdefault(base, _Hist())
        if key.name == fam + "_bucket":
            le = dict(key.labels).get("le", "+Inf")
            h.bounds[float(le)] = value
        elif key.name == fam + "_count":
            h.count = value
        elif key.name == fam + "_sum":
            h.total = value
    points = []
    for labels, h in sorted(groups.items()):
        les = sorted(h.bounds)
        if not les or math.isnan(h.count):
            continue  # a histogram missing its count cannot be sent whole
        finite = [le for le in les if math.isfinite(le)]
        cumulative = [h.bounds[le] for le in finite] + [h.count]
        counts = [int(cumulative[0])] + [
            int(max(0.0, b - a)) for a, b in itertools.pairwise(cumulative)
        ]
        points.append(
            HistogramDataPoint(
                attributes=_attrs(labels, conv, server),
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=int(h.count),
                sum=h.total if math.isfinite(h.total) else 0.0,
                explicit_bounds=finite,
                bucket_counts=counts,
                # A Prometheus histogram has neither: None leaves the fields unset on the wire.
                min=None,  # type: ignore[arg-type]
                max=None,  # type: ignore[arg-type]
            )
        )
    return points


def _number_points(
    series: dict[SeriesKey, float],
    start_ns: int,
    now_ns: int,
    conv: SemConv | None,
    server: Mapping[str, str],
) -> list[NumberDataPoint]:
    return [
        NumberDataPoint(
            attributes=_attrs(key.labels, conv, server),
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            value=float(value),  # a double on the wire, as /metrics has it
        )
        for key, value in sorted(series.items())
    ]


def _metric(
    store: Store,
    fam: str,
    typ: str,
    conv: SemConv | None,
    series: dict[SeriesKey, float],
    span_ns: tuple[int, int],
    server: Mapping[str, str],
) -> Metric:
    meta_name = fam + "_total" if typ == "counter" else fam
    meta = store.meta(meta_name) or store.meta(fam)
    start_ns, now_ns = span_ns
    data: Histogram | Sum | Gauge
    if typ == "histogram":
        data = Histogram(
            data_points=_histogram_points(fam, series, start_ns, now_ns, conv, server),
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
        )
    elif typ == "counter":
        data = Sum(
            data_points=_number_points(series, start_ns, now_ns, conv, server),
            aggregation_temporality=AggregationTemporality.CUMULATIVE,
            is_monotonic=True,
        )
    else:
        data = Gauge(data_points=_number_points(series, start_ns, now_ns, conv, server))
    return Metric(
        name=conv.name if conv else fam,
        description=meta.help if meta else "",
        unit=conv.unit if conv else _unit_of(fam),
        data=data,
    )


def build_metrics_data(
    store: Store,
    now: float,
    *,
    started_at: float,
    stale_after_s: float,
    resource: Resource,
    engine_url: str | None = None,
) -> MetricsData:
    """One OTLP export of every live series in ``store`` at ``now`` (Unix seconds), under
    ``resource`` (the agent's one Resource, its spans' too)."""
    # (family, convention name or None) -> (type, series): a family's GPU series and
    # its CPU-cgroup series go out as two metrics.
    groups: dict[tuple[str, str | None], tuple[str, SemConv | None, dict[SeriesKey, float]]] = {}
    for key, value in _latest(store, now, stale_after_s).items():
        fam, typ, _ = family_of(store, key.name)
        base = [(k, v) for k, v in key.labels if k != "le"]
        conv = convention(fam, base)
        groups.setdefault((fam, conv.name if conv else None), (typ, conv, {}))[2][key] = value
    start_ns, now_ns = int(started_at * 1e9), int(now * 1e9)
    server = server_attributes(engine_url)
    metrics = []
    for (fam, _), (typ, conv, series) in sorted(
        groups.items(), key=lambda g: (g[0][0], g[0][1] or "")
    ):
        metrics.append(_metric(store, fam, typ, conv, series, (start_ns, now_ns), server))
    scope = InstrumentationScope(name="kcops.agent", version=__version__)
    return MetricsData(
        resource_metrics=[
            ResourceMetrics(
                resource=resource,
                scope_metrics=[ScopeMetrics(scope=scope, metrics=metrics, schema_url="")],
                schema_url=resource.schema_url,
            )
        ]
    )
