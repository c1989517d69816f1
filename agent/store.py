"""In-memory time series store: one ring buffer per series, bounded retention.

This is what the rule engine reads windows from and what the exporter
publishes. It is owned by the agent's event loop and is not thread-safe: all
appends and reads happen on the loop (collectors that work in threads hand
their samples back to the loop).

Timestamps are Unix seconds (floats). Samples of one series must arrive in
time order; an out-of-order sample is dropped and counted, as Prometheus's
TSDB does.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kcops.agent.samples import STALE_NAN, Sample, SeriesKey, is_stale


class _Ring:
    """Parallel arrays of timestamps and values with a moving head.

    Eviction advances ``head``; the arrays are compacted when the dead prefix
    is larger than the live part, so appends stay amortised O(1).
    """

    __slots__ = ("head", "ts", "vs")

    def __init__(self) -> None:
        self.ts = array("d")
        self.vs = array("d")
        self.head = 0

    def __len__(self) -> int:
        return len(self.ts) - self.head

    def append(self, t: float, v: float) -> None:
        self.ts.append(t)
        self.vs.append(v)

    def last_ts(self) -> float | None:
        return self.ts[-1] if len(self) else None

    def drop_before(self, t: float) -> None:
        i = bisect.bisect_left(self.ts, t, lo=self.head)
        self.head = i
        if self.head and self.head * 2 > len(self.ts):
            self.ts = self.ts[self.head :]
            self.vs = self.vs[self.head :]
            self.head = 0

    def window(self, start: float, end: float, left_open: bool) -> tuple[array, array]:
        if left_open:
            lo = bisect.bisect_right(self.ts, start, lo=self.head)
        else:
            lo = bisect.bisect_left(self.ts, start, lo=self.head)
        hi = bisect.bisect_right(self.ts, end, lo=lo)
        return self.ts[lo:hi], self.vs[lo:hi]


@dataclass(frozen=True)
class Meta:
    """Type and help of a metric family, for the exporter."""

    type: str  # counter | gauge | histogram | untyped
    help: str


class Store:
    """Series name + labels -> timestamped samples, kept for ``retention_s``.

    ``max_series`` bounds memory: a sample of a new series beyond the limit
    is dropped and counted in ``dropped_series``.
    """

    def __init__(self, retention_s: float = 3600.0, max_series: int = 50_000) -> None:
        if retention_s <= 0:
            raise ValueError(f"retention_s must be > 0, got {retention_s}")
        self.retention_s = float(retention_s)
        self.max_series = int(max_series)
        self._series: dict[SeriesKey, _Ring] = {}
        self._by_name: dict[str, set[SeriesKey]] = {}
        self._meta: dict[str, Meta] = {}
        self.dropped_out_of_order = 0
        self.dropped_series = 0

    # -- writing -----------------------------------------------------------

    def append(self, key: SeriesKey, ts: float, value: float) -> bool:
        """Append one sample; returns False when it was dropped."""
        ring = self._series.get(key)
        if ring is None:
            if len(self._series) >= self.max_series:
                self.dropped_series += 1
                return False
            ring = _Ring()
            self._series[key] = ring
            self._by_name.setdefault(key.name, set()).add(key)
        last = ring.last_ts()
        if last is not None and ts < last:
            self.dropped_out_of_order += 1
            return False
        if last is not None and ts == last:
            # Same timestamp: the newer value wins, like a re-scrape would.
            ring.vs[-1] = value
            return True
        ring.append(ts, float(value))
        return True

    def add(self, samples: Iterable[Sample], now: float) -> int:
        """Append samples whose ``ts`` is None at ``now``; returns how many landed."""
        n = 0
        for s in samples:
            if self.append(SeriesKey(s.name, s.labels), now if s.ts is None else s.ts, s.value):
                n += 1
        return n

    def mark_stale(self, key: SeriesKey, ts: float) -> None:
        """Write Prometheus's staleness marker: the series stops here."""
        ring = self._series.get(key)
        if ring is None or not len(ring):
            return
        if is_stale(ring.vs[-1]):
            return
        self.append(key, ts, STALE_NAN)

    def set_meta(self, name: str, type_: str, help_: str) -> None:
        self._meta[name] = Meta(type_, help_)

    def meta(self, name: str) -> Meta | None:
        return self._meta.get(name)

    def evict(self, now: float) -> None:
        """Drop samples older than the retention window, and empty series."""
        cutoff = now - self.retention_s
        empty = []
        for key, ring in self._series.items():
            ring.drop_before(cutoff)
            if not len(ring):
                empty.append(key)
        for key in empty:
            del self._series[key]
            names = self._by_name.get(key.name)
            if names is not None:
                names.discard(key)
                if not names:
                    del self._by_name[key.name]

    # -- reading -----------------------------------------------------------

    def __len__(self) -> int:
        return len(self._series)

    def __contains__(self, key: object) -> bool:
        return key in self._series

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def keys(self, name: str | None = None) -> Iterator[SeriesKey]:
        """All series keys, or those of one metric name."""
        if name is None:
            yield from list(self._series)
        else:
            yield from list(self._by_name.get(name, ()))

    def range(
        self, key: SeriesKey, start: float, end: float, *, left_open: bool = False
    ) -> list[tuple[float, float]]:
        """Samples with ``start <= ts <= end`` (``start < ts`` when left_open).

        Staleness markers are returned as they are; callers that want
        Prometheus semantics use :func:`kcops.agent.samples.is_stale`.
        """
        ring = self._series.get(key)
        if ring is None:
            return []
        ts, vs = ring.window(start, end, left_open)
        return list(zip(ts, vs, strict=True))

    def range_arrays(
        self, key: SeriesKey, start: float, end: float, *, left_open: bool = False
    ) -> tuple[array, array]:
        """Like :meth:`range` but as two arrays (timestamps, values), without copies per sample."""
        ring = self._series.get(key)
        if ring is None:
            return array("d"), array("d")
        return ring.window(start, end, left_open)

    def latest(
        self, key: SeriesKey, at: float | None = None, lookback_s: float | None = None
    ) -> tuple[float, float] | None:
        """The newest sample at or before ``at`` within ``lookback_s``.

        Returns None when there is none, or when the newest one is a
        staleness marker: an absent value is absent, never 0.
        """
        ring = self._series.get(key)
        if ring is None or not len(ring):
            return None
        if at is None:
            i = len(ring.ts) - 1
        else:
            i = bisect.bisect_right(ring.ts, at, lo=ring.head) - 1
            if i < ring.head:
                return None
        t, v = ring.ts[i], ring.vs[i]
        if is_stale(v):
            return None
        if lookback_s is not None and at is not None and t <= at - lookback_s:
            return None
        return t, v
