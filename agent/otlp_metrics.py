"""The agent's series as OTLP metrics, pushed over OTLP/HTTP (protobuf).

Built from the store directly, as ``/metrics`` is, so both show the same
values: each series' newest sample unless older than ``stale_after_s``.
Histograms keep their buckets (Prometheus's cumulative ``le`` counts become
OTLP explicit-bucket counts); counters are cumulative monotonic sums.

Where OpenTelemetry has a semantic convention, the series is exported under
its name and unit (``hw.gpu.*`` for the device, ``gen_ai.server.*`` for the
serving latencies); everything else keeps its Prometheus family name.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

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


GPU = (("hw.type", "gpu"),)
SEMCONV: dict[str, SemConv] = {
    "kcops_device_memory_used_bytes": SemConv("hw.gpu.memory.usage", "By", GPU),
    "kcops_device_memory_total_bytes": SemConv("hw.gpu.memory.limit", "By", GPU),
    "kcops_gpu_utilization_ratio": SemConv("hw.gpu.utilization", "1", GPU),
    "kcops_gpu_temperature_celsius": SemConv("hw.temperature", "Cel", GPU),
    "kcops_gpu_power_watts": SemConv("hw.power", "W", GPU),
    "kcops_ttft_seconds": SemConv("gen_ai.server.time_to_first_token", "s"),
    "kcops_inter_token_latency_seconds": SemConv("gen_ai.server.time_per_output_token", "s"),
    "kcops_request_latency_seconds": SemConv("gen_ai.server.request.duration", "s"),
}
# Prometheus label -> semantic-convention attribute, for the families above.
ATTR_RENAME = {"device": "hw.id"}


def _unit_of(family: str) -> str:
    for suffix, unit in (("_seconds", "s"), ("_bytes", "By"), ("_ratio", "1")):
        if family.endswith(suffix):
            return unit
    return ""


def _attrs(labels: Iterable[tuple[str, str]], conv: SemConv | None) -> list[KeyValue]:
    pairs = dict(labels)
    if conv is not None:
        pairs = {ATTR_RENAME.get(k, k): v for k, v in pairs.items()}
        pairs.update(conv.extra)
    # protobuf refuses text UTF-8 cannot encode: escape it rather than lose the batch
    return [
        KeyValue(key=safe_text(k), value=AnyValue(string_value=safe_text(v)))
        for k, v in sorted(pairs.items())
    ]


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
    fam: str, series: dict[SeriesKey, float], start_ns: int, now_ns: int, conv: SemConv | None
) -> list[pb.HistogramDataPoint]:
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
            pb.HistogramDataPoint(
                attributes=_attrs(labels, conv),
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=int(h.count),
                sum=h.total if math.isfinite(h.total) else 0.0,
                explicit_bounds=finite,
                bucket_counts=counts,
            )
        )
    return points


def _number_points(
    series: dict[SeriesKey, float], start_ns: int, now_ns: int, conv: SemConv | None
) -> list[pb.NumberDataPoint]:
    return [
        pb.NumberDataPoint(
            attributes=_attrs(key.labels, conv),
            start_time_unix_nano=start_ns,
            time_unix_nano=now_ns,
            as_double=value,
        )
        for key, value in sorted(series.items())
    ]


def build_request(
    store: Store,
    now: float,
    *,
    started_at: float,
    stale_after_s: float,
    service_name: str,
) -> ExportMetricsServiceRequest:
    """One OTLP export of every live series in ``store`` at ``now`` (Unix seconds)."""
    by_family: dict[str, tuple[str, dict[SeriesKey, float]]] = {}
    for key, value in _latest(store, now, stale_after_s).items():
        fam, typ, _ = family_of(store, key.name)
        by_family.setdefault(fam, (typ, {}))[1][key] = value
    start_ns, now_ns = int(started_at * 1e9), int(now * 1e9)
    metrics = []
    for fam, (typ, series) in sorted(by_family.items()):
        meta_name = fam + "_total" if typ == "counter" else fam
        meta = store.meta(meta_name) or store.meta(fam)
        conv = SEMCONV.get(fam)
        m = pb.Metric(
            name=conv.name if conv else fam,
            unit=conv.unit if conv else _unit_of(fam),
            description=meta.help if meta else "",
        )
        if typ == "histogram":
            m.histogram.data_points.extend(_histogram_points(fam, series, start_ns, now_ns, conv))
            m.histogram.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
        elif typ == "counter":
            m.sum.data_points.extend(_number_points(series, start_ns, now_ns, conv))
            m.sum.is_monotonic = True
            m.sum.aggregation_temporality = pb.AGGREGATION_TEMPORALITY_CUMULATIVE
        else:
            m.gauge.data_points.extend(_number_points(series, start_ns, now_ns, conv))
        metrics.append(m)
    resource = Resource(
        attributes=[
            KeyValue(key="service.name", value=AnyValue(string_value=service_name)),
            KeyValue(key="service.version", value=AnyValue(string_value=__version__)),
        ]
    )
    scope = InstrumentationScope(name="kcops.agent", version=__version__)
    return ExportMetricsServiceRequest(
        resource_metrics=[
            pb.ResourceMetrics(
                resource=resource, scope_metrics=[pb.ScopeMetrics(scope=scope, metrics=metrics)]
            )
        ]
    )
