"""The unit of data that flows from collectors into the store.

A sample is one value of one series at one time. Histograms travel as their
Prometheus series (``_bucket`` with ``le``, ``_sum``, ``_count``), exactly as
Prometheus stores them, so the rule engine sees what Prometheus would see.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from kcops.histogram import Histogram, format_le

# Prometheus marks a series that disappeared with this exact NaN bit pattern
# (value.StaleNaN in prometheus/model). Rules treat it as "no sample", not NaN.
STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]

LabelPairs = tuple[tuple[str, str], ...]
_new_tuple = tuple.__new__


@dataclass(frozen=True)
class ParsedSample:
    """One sample of an exposition page as its parser reads it (collectors/promtext.py),
    before an engine kind's adapter maps it to a canonical :class:`Sample`."""

    name: str
    labels: dict[str, str]
    value: float


def is_stale(value: float) -> bool:
    """True only for the staleness marker, not for an ordinary NaN."""
    if not math.isnan(value):
        return False
    return struct.unpack("<Q", struct.pack("<d", value))[0] == STALE_NAN_BITS


def label_pairs(labels: Mapping[str, str] | None) -> LabelPairs:
    """Canonical, hashable, sorted form of a label set."""
    if not labels:
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in labels.items()))


class SeriesKey(NamedTuple):
    """Identity of a series: metric name plus sorted label pairs."""

    name: str
    labels: LabelPairs

    @classmethod
    def of(cls, name: str, labels: Mapping[str, str] | None = None) -> SeriesKey:
        return cls(name, label_pairs(labels))

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        inner = ",".join(f'{k}="{v}"' for k, v in self.labels)
        return f"{self.name}{{{inner}}}"


class Sample(NamedTuple):
    """One value of one series. ``ts`` is Unix seconds; None means "now"."""

    name: str
    labels: LabelPairs
    value: float
    ts: float | None = None

    @classmethod
    def of(
        cls,
        name: str,
        value: float,
        labels: Mapping[str, str] | None = None,
        ts: float | None = None,
    ) -> Sample:
        return cls(name, label_pairs(labels), float(value), ts)

    @property
    def key(self) -> SeriesKey:
        return SeriesKey(self.name, self.labels)


@lru_cache(maxsize=4096)
def _le_labels(bounds: tuple[float, ...], labels: LabelPairs) -> tuple[LabelPairs, ...]:
    """Sorted label pairs of each bucket series, +Inf last (cached: the same every tick)."""
    return tuple(tuple(sorted((*labels, ("le", format_le(b))))) for b in (*bounds, math.inf))


def histogram_samples(name: str, h: Histogram, labels: LabelPairs, out: list[Sample]) -> None:
    """Append ``h`` as Prometheus series: ``name_bucket`` (cumulative, ``le`` as Prometheus
    writes it), ``name_sum`` and ``name_count``. ``labels`` must be sorted."""
    acc = 0
    bucket = name + "_bucket"
    append = out.append
    # tuple.__new__ is what Sample(...) runs, without its Python-level __new__: this
    # loop makes a sample a bucket of every histogram, every tick.
    for lp, c in zip(_le_labels(h.bounds, labels), h.counts, strict=True):
        acc += c
        append(_new_tuple(Sample, (bucket, lp, float(acc), None)))
    append(Sample(name + "_sum", labels, h.sum))
    append(Sample(name + "_count", labels, float(acc)))
