"""The unit of data that flows from collectors into the store.

A sample is one value of one series at one time. Histograms travel as their
Prometheus series (``_bucket`` with ``le``, ``_sum``, ``_count``), exactly as
Prometheus stores them, so the rule engine sees what Prometheus would see.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from typing import NamedTuple

# Prometheus marks a series that disappeared with this exact NaN bit pattern
# (value.StaleNaN in prometheus/model). Rules treat it as "no sample", not NaN.
STALE_NAN_BITS = 0x7FF0000000000002
STALE_NAN: float = struct.unpack("<d", struct.pack("<Q", STALE_NAN_BITS))[0]

LabelPairs = tuple[tuple[str, str], ...]


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
