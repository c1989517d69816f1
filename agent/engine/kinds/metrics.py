"""An engine kind's metric adapter: a table from its ``/metrics`` families to canonical ones.

Each adapter is data, not code: a list of :class:`Map` rows. A row names a
canonical family (docs/architecture.md#signals) and the engine families that can provide it, in
order of preference, so that a version exposing a deprecated name still maps
(the first source present on the page wins; absent sources stay absent).
Values and histogram buckets are copied as they are, except where a row
converts units (``scale``: Triton reports milliseconds) or reads its value from a label
of an info gauge (``value_label``: vLLM's ``vllm:cache_config_info{num_gpu_blocks}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client.utils import floatToGoString

from kcops.agent.samples import ParsedSample, Sample

GAUGE = "gauge"
COUNTER = "counter"
HISTOGRAM = "histogram"
# A counter read from a histogram's ``_count`` (vLLM counts engine steps only as the
# observations of ``vllm:iteration_tokens_total``): exported as ``<target>_total``.
COUNT = "count"

_SUFFIX = {
    GAUGE: ("",),
    COUNTER: ("_total",),
    HISTOGRAM: ("_bucket", "_sum", "_count"),
    COUNT: ("_count",),
}


@dataclass(frozen=True)
class Map:
    """One canonical family and its engine sources (base names, without ``_total``)."""

    target: str  # canonical base name: no _total for counters, no _bucket for histograms
    kind: str
    sources: tuple[str, ...]
    scale: float = 1.0  # unit conversion; for histograms applied to `le` and `_sum`
    # A gauge whose value is this label's (an info gauge's field); the other labels go,
    # but the engine's own index. A value that is not a number leaves no sample.
    value_label: str | None = None


@dataclass(frozen=True)
class Adapter:
    name: str
    maps: tuple[Map, ...]
    # Base-name prefixes whose presence on a page identifies this engine (detection).
    markers: tuple[str, ...] = ()
    # Engine labels renamed so they do not clash with ours (vLLM's `engine` is an index).
    rename_labels: dict[str, str] = field(default_factory=dict)

    def wanted(self) -> frozenset[str]:
        """Every engine base name this adapter may read."""
        return frozenset(s for m in self.maps for s in m.sources)

    def detects(self, names: Iterable[str]) -> bool:
        return any(n.startswith(p) for n in names for p in self.markers)

    def map(self, parsed: Sequence[ParsedSample]) -> list[Sample]:
        """Canonical samples (label ``engine`` = adapter name) from parsed engine samples."""
        by_name: dict[str, list[ParsedSample]] = {}
        for s in parsed:
            by_name.setdefault(s.name, []).append(s)
        out: list[Sample] = []
        for m in self.maps:
            for src in m.sources:
                found = [
                    (suf, by_name[src + suf]) for suf in _SUFFIX[m.kind] if src + suf in by_name
                ]
                if found:
                    for suf, rows in found:
                        out.extend(self._convert(m, suf, rows))
                    break
        return out

    def _convert(self, m: Map, suffix: str, rows: Sequence[ParsedSample]) -> list[Sample]:
        out = []
        name = m.target + ("_total" if m.kind == COUNT else suffix)
        for s in rows:
            labels = {self.rename_labels.get(k, k): v for k, v in s.labels.items()}
            value = s.value
            if m.value_label is not None:
                try:
                    value = float(labels[m.value_label])
                except (KeyError, ValueError):
                    continue
                labels = {k: v for k, v in labels.items() if k in self.rename_labels.values()}
            labels["engine"] = self.name
            if m.scale != 1.0:
                if suffix == "_bucket":
                    le = labels["le"]
                    if le != "+Inf":
                        labels["le"] = floatToGoString(float(le) * m.scale)
                elif suffix != "_count":
                    value = value * m.scale
            out.append(Sample.of(name, value, labels))
        return out
