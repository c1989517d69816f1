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


class _LeCache:
    """The sorted label pairs of each bucket series of a histogram, ``+Inf`` last, by
    (bounds, labels): the same every tick. Not LRU: a tick walks every histogram in the
    same order, so one histogram more than an LRU holds would miss every time (a flood of
    probe processes did: 4,224 histograms a tick against 4,096 entries cost 0.9 s a tick).
    When full, a miss is computed and not kept; after as many misses as the cache holds
    (its entries are of series gone by now), it starts over."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.held: dict[tuple[tuple[float, ...], LabelPairs], tuple[LabelPairs, ...]] = {}
        self.misses = 0  # while full

    def get(self, bounds: tuple[float, ...], labels: LabelPairs) -> tuple[LabelPairs, ...]:
        key = (bounds, labels)
        got = self.held.get(key)
        if got is not None:
            return got
        got = tuple(tuple(sorted((*labels, ("le", format_le(b))))) for b in (*bounds, math.inf))
        if len(self.held) < self.size:
            self.held[key] = got
        else:
            self.misses += 1
            if self.misses >= self.size:
                self.held.clear()
                self.misses = 0
        return got


_le_labels = _LeCache(1024).get


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
