"""In-memory time series store: one ring buffer per series, bounded retention.

This is what the rule engine reads windows from and what the exporter
publishes. It is owned by the agent's event loop and is not thread-safe
(collectors that work in threads hand their samples back to the loop).
Timestamps are Unix seconds; an out-of-order sample is dropped and counted, as
Prometheus's TSDB does.

Memory has a ceiling, ``max_bytes``, against an estimate of what the store has
allocated: every slot of its sample arrays (:data:`SLOT_BYTES`), the dead prefix
that eviction left behind included, plus each series' key and bookkeeping. A
ring compacts once its dead prefix is an eighth of it. Over the budget, a sample
of a new series is refused (``refused_series``), and each :meth:`Store.evict`
drops the oldest samples of every series, as a shorter retention would, until
the estimate is back under it (``evicted_samples``). Eviction runs every
``EVICT_EVERY_TICKS`` (the app's), so the store may overshoot by that many
ticks' samples.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kcops.agent.quotas import Quotas
from kcops.agent.samples import STALE_NAN, LabelPairs, Sample, SeriesKey, is_stale

_new_tuple = tuple.__new__

AGENT = "agent"  # the source of the agent's own series
# Whose budget a new series counts against: one source, or one per label set.
Source = str | Callable[[LabelPairs], str]


class _Ring:
    """Parallel arrays of timestamps and values with a moving head.

    Eviction advances ``head``; the arrays are compacted when the dead prefix
    is an eighth of them (and at least :data:`COMPACT_MIN` slots), so memory
    stays close to what is live and appends stay amortised O(1).
    """

    __slots__ = ("head", "key", "ts", "vs")

    def __init__(self, key: SeriesKey) -> None:
        self.key = key  # the store's own key object, handed back by Store.write
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

    def drop_before(self, t: float, compact: bool = False) -> tuple[int, int]:
        """Drop samples older than ``t``: (samples dropped, slots freed by compacting).

        ``compact`` frees the dead prefix now, however small (the budget needs it).
        """
        i = bisect.bisect_left(self.ts, t, lo=self.head)
        dropped = i - self.head
        head = self.head = i
        if head and (compact or (head >= COMPACT_MIN and head * 8 > len(self.ts))):
            self.ts = self.ts[head:]
            self.vs = self.vs[head:]
            self.head = 0
            return dropped, head
        return dropped, 0

    def window(self, start: float, end: float, left_open: bool) -> tuple[array, array]:
        first = bisect.bisect_right if left_open else bisect.bisect_left
        lo = first(self.ts, start, lo=self.head)
        hi = bisect.bisect_right(self.ts, end, lo=lo)
        return self.ts[lo:hi], self.vs[lo:hi]


@dataclass(frozen=True)
class Meta:
    """Type and help of a metric family, for the exporter."""

    type: str  # counter | gauge | histogram | untyped
    help: str


SAMPLE_BYTES = 16  # a float64 timestamp and a float64 value
SLOT_BYTES = 17  # one slot of both arrays, with array's ~1/16 over-allocation
COMPACT_MIN = 64  # slots: a smaller dead prefix is not worth a copy
SERIES_BYTES = 600  # key tuple, label tuples, ring, two arrays, dict and set slots
DEFAULT_MAX_BYTES = 256 << 20


def series_bytes(key: SeriesKey) -> int:
    """Estimated bytes one series costs before its samples."""
    return SERIES_BYTES + len(key.name) + sum(len(k) + len(v) + 120 for k, v in key.labels)


class Store:
    """Series name + labels -> timestamped samples, kept for ``retention_s``.

    ``max_series`` (a new series past it is dropped: ``dropped_series``) and
    ``max_bytes`` (the module's docstring) bound memory; each source of series has a
    budget of its own (:mod:`kcops.agent.quotas`).
    """

    def __init__(
        self,
        retention_s: float = 3600.0,
        max_series: int = 50_000,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_series_per_source: int = 20_000,
        quiet_after_s: float = 300.0,
    ) -> None:
        if retention_s <= 0:
            raise ValueError(f"retention_s must be > 0, got {retention_s}")
        if max_bytes < 1 << 20:
            raise ValueError(f"max_bytes must be at least 1 MiB, got {max_bytes}")
        self.retention_s = float(retention_s)
        self.max_series = int(max_series)
        self.max_bytes = int(max_bytes)
        self._series: dict[SeriesKey, _Ring] = {}
        self._by_name: dict[str, set[SeriesKey]] = {}
        self._meta: dict[str, Meta] = {}
        self._key_bytes = 0
        self._slots = 0  # allocated sample slots of every ring, dead prefixes included
        self.dropped_out_of_order = 0
        self.dropped_series = 0
        self.refused_series = 0
        self.evicted_samples = 0
        self.quotas = Quotas(max_series_per_source, quiet_after_s)
        self.over_budget = 0  # samples of a new series its source had no budget for
        # New series refused for their source's budget or share, by (name, labels): their
        # next samples are refused without asking again, until the next eviction (when a
        # quiet source frees room). Bounded: at most the series of one tick's refusals.
        self._refused: dict[tuple[str, LabelPairs], tuple[SeriesKey, str, bool]] = {}

    @property
    def bytes_estimate(self) -> int:
        """What the store has allocated, by its own estimate (see the module docstring)."""
        return self._key_bytes + SLOT_BYTES * self._slots

    # -- writing -----------------------------------------------------------

    def append(self, key: SeriesKey, ts: float, value: float, source: str = AGENT) -> bool:
        """Append one sample; returns False when it was dropped. ``source``: whose budget
        a new series counts against."""
        ring = self._series.get(key)
        if ring is None:
            if not self.quotas.admit(source):
                self._refuse_again(key, source, over_budget=True)
                return False
            if len(self._series) >= self.max_series:
                victim = self.quotas.victim(source, self.max_series)
                if victim is None:
                    self.quotas.refuse(source, f"the store holds max_series={self.max_series}")
                    self._refuse_again(key, source, over_budget=False)
                    return False
                self._remove(victim)
            if self.bytes_estimate >= self.max_bytes:
                self.refused_series += 1
                return False
            ring = _Ring(key)
            self._series[key] = ring
            self._by_name.setdefault(key.name, set()).add(key)
            self._key_bytes += series_bytes(key)
            self.quotas.added(key, source)
        last = ring.last_ts()
        if last is not None and ts < last:
            self.dropped_out_of_order += 1
            return False
        if last is not None and ts == last:
            # Same timestamp: the newer value wins, like a re-scrape would.
            ring.vs[-1] = value
            return True
        ring.append(ts, float(value))
        self._slots += 1
        return True

    def _refuse_again(self, key: SeriesKey, source: str, *, over_budget: bool) -> None:
        """Count a refused sample, and remember its series as refused until eviction."""
        self._count_refused(over_budget)
        if len(self._refused) < self.max_series:
            self._refused[(key.name, key.labels)] = (key, source, over_budget)

    def _count_refused(self, over_budget: bool) -> None:
        if over_budget:
            self.over_budget += 1
        else:
            self.dropped_series += 1

    def add(self, samples: Iterable[Sample], now: float, source: Source = AGENT) -> int:
        """Append samples whose ``ts`` is None at ``now``; returns how many landed."""
        return self._write(samples, now, source)[0]

    def write(
        self, samples: Iterable[Sample], now: float, source: Source = AGENT
    ) -> set[SeriesKey]:
        """Like :meth:`add`, but returns the key of every sample, landed or not: what
        the collector runner compares with the previous tick for staleness markers."""
        return self._write(samples, now, source)[1]

    def _write(
        self, samples: Iterable[Sample], now: float, source: Source
    ) -> tuple[int, set[SeriesKey]]:
        """Append ``samples``: (how many landed, the key of each).

        The hot path of every tick: a sample of a series that exists, newer than its
        last one, is appended here without building a key (the lookup uses a plain
        ``(name, labels)`` tuple, equal to the stored key; the key set gets the stored
        key object itself); anything else goes through :meth:`append`.
        """
        series = self._series
        refusing: dict[str, bool] = {}  # sources refused in this write, over budget or not
        keys: set[SeriesKey] = set()
        remember = keys.add
        landed = 0
        for s in samples:
            name, labels, value, ts = s
            t = now if ts is None else ts
            ring = series.get((name, labels))  # type: ignore[call-overload]  # == its SeriesKey
            if ring is not None:
                rts = ring.ts
                if len(rts) > ring.head and t > rts[-1]:
                    v = float(value)
                    rts.append(t)
                    ring.vs.append(v)
                    self._slots += 1
                    remember(ring.key)
                    landed += 1
                    continue
                key = ring.key
            else:
                refused = self._refused.get((name, labels))
                if refused is not None:  # refused before: no new key, no question
                    key, src, over = refused
                    remember(key)
                    self.quotas.refuse(src, "")
                    self._count_refused(over)
                    continue
                src = source if isinstance(source, str) else source(labels)
                key = _new_tuple(SeriesKey, (name, labels))  # SeriesKey(...), at C speed
                remember(key)
                again = refusing.get(src)
                if again is not None:  # refused earlier in this write: the same answer now
                    self.quotas.refuse(src, "")
                    self._count_refused(again)
                    continue
                if self.append(key, t, value, src):
                    landed += 1
                elif (why := self._refused.get((name, labels))) is not None:
                    refusing[src] = why[2]
                continue
            remember(key)
            src = source if isinstance(source, str) else source(labels)
            if self.append(key, t, value, src):
                landed += 1
        return landed, keys

    def mark_stale(self, key: SeriesKey, ts: float) -> None:
        """Write Prometheus's staleness marker: the series stops here."""
        ring = self._series.get(key)
        if ring is not None and len(ring) and not is_stale(ring.vs[-1]):
            self.append(key, ts, STALE_NAN)

    def set_meta(self, name: str, type_: str, help_: str) -> None:
        self._meta[name] = Meta(type_, help_)

    def meta(self, name: str) -> Meta | None:
        return self._meta.get(name)

    def evict(self, now: float) -> None:
        """Drop samples older than the retention window, and empty series.

        Over ``max_bytes``, the window shrinks (by eighths of the retention, the
        newest sample of each series always kept) until the estimate fits.
        """
        cutoff = now - self.retention_s
        self._drop_before(cutoff)
        self.quotas.quiet(now, self._last_ts)
        self._refused.clear()  # room may have come: ask again
        step = self.retention_s / 8
        while self.bytes_estimate > self.max_bytes and cutoff < now:
            cutoff = min(now, cutoff + step)
            self.evicted_samples += self._drop_before(cutoff, keep_last=True)

    def _drop_before(self, cutoff: float, keep_last: bool = False) -> int:
        """Drop samples before ``cutoff`` (``keep_last``: over budget, compacting each ring)."""
        empty = []
        dropped = 0
        freed = 0
        for key, ring in self._series.items():
            n = len(ring)
            t = ring.ts[-1] if keep_last and n and ring.ts[-1] < cutoff else cutoff
            d, f = ring.drop_before(t, compact=keep_last)
            dropped += d
            freed += f
            if not len(ring):
                empty.append(key)
        self._slots -= freed
        for key in empty:
            self._remove(key)
        return dropped

    def _remove(self, key: SeriesKey) -> None:
        """Forget a series whole (empty after eviction, or replaced in a full store)."""
        self._slots -= len(self._series[key].ts)
        del self._series[key]
        self._key_bytes -= series_bytes(key)
        self.quotas.removed(key)
        names = self._by_name.get(key.name)
        if names is not None:
            names.discard(key)
            if not names:
                del self._by_name[key.name]

    def _last_ts(self, key: SeriesKey) -> float | None:
        ring = self._series.get(key)
        return ring.last_ts() if ring is not None else None

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
        ts, vs = self.range_arrays(key, start, end, left_open=left_open)
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
