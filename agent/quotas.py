"""Series budgets per source, so that one source never starves another (Prometheus's
per-target ``sample_limit``, for the agent's store).

A source is what wrote a series first: one probe process, one scrape target, one of
the agent's own collectors. Each may hold ``per_source`` series; past it, that
source's new series are refused and counted against it, the others' are not. A
series quiet for ``quiet_after_s`` no longer counts against its source. When the
whole store is full, a new series of a source holding less than its fair share takes
the place of the quietest series of the source holding the most, so a new,
well-behaved source is always admitted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kcops.agent.samples import LabelPairs, SeriesKey

log = logging.getLogger("kcops.agent.store")

MAX_SOURCES = 256  # distinct sources named in the counters; the rest are "other"
OTHER = "other"
MAX_WARNED = 20  # sources named in the log; the counters name the rest


def probe_source(labels: LabelPairs) -> str:
    """A probe's series belong to its process, ``probe:<engine>/<process>``; the
    receiver's own (no ``process`` label) to ``probe``."""
    d = dict(labels)
    if "process" not in d:
        return "probe"
    return f"probe:{d.get('engine', '?')}/{d['process']}"


class Quotas:
    def __init__(self, per_source: int, quiet_after_s: float = 300.0) -> None:
        if per_source < 1:
            raise ValueError(f"per_source must be >= 1, got {per_source}")
        self.per_source = per_source
        self.quiet_after_s = quiet_after_s
        self.source_of: dict[SeriesKey, str] = {}
        self.keys: dict[str, set[SeriesKey]] = {}  # live (not quiet) series by source
        self.quiet_keys: set[SeriesKey] = set()  # no longer counted against their source
        self.refused: dict[str, int] = {}  # new series refused, by source (bounded)
        self._warned: set[str] = set()
        self._over: str | None = None  # the source over its share a series was last taken from

    def count(self, source: str) -> int:
        return len(self.keys.get(source, ()))

    def admit(self, source: str) -> bool:
        """Whether ``source`` may add one more series; a refusal is counted and named."""
        if self.count(source) < self.per_source:
            return True
        self.refuse(source, f"over its budget of {self.per_source} series")
        return False

    def refuse(self, source: str, why: str) -> None:
        name = source if source in self.refused or len(self.refused) < MAX_SOURCES else OTHER
        self.refused[name] = self.refused.get(name, 0) + 1
        if name in self._warned:
            return
        self._warned.add(name)
        if len(self._warned) <= MAX_WARNED:
            log.warning("store: series of source %s refused (%s); counted, warned once", name, why)
        if len(self._warned) == MAX_WARNED:
            log.warning(
                "store: %d sources refused series; more are counted by source in "
                "kcops_store_source_refused_samples_total, without a warning each",
                MAX_WARNED,
            )

    def added(self, key: SeriesKey, source: str) -> None:
        self.source_of[key] = source
        self.keys.setdefault(source, set()).add(key)

    def removed(self, key: SeriesKey) -> None:
        self.quiet_keys.discard(key)
        source = self.source_of.pop(key, None)
        keys = self.keys.get(source) if source is not None else None
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.keys[source]  # type: ignore[arg-type]

    def quiet(self, now: float, last_ts: Callable[[SeriesKey], float | None]) -> None:
        """Series with no sample for ``quiet_after_s`` stop counting against their source
        (still kept for the rules' windows, until retention or a new source's need)."""
        cutoff = now - self.quiet_after_s
        for k in [k for k in self.quiet_keys if (last_ts(k) or 0.0) >= cutoff]:
            self.quiet_keys.discard(k)  # its source writes it again: counted again
            self.keys.setdefault(self.source_of[k], set()).add(k)
        for source, keys in list(self.keys.items()):
            gone = [k for k in keys if (last_ts(k) or 0.0) < cutoff]
            for k in gone:
                keys.discard(k)
                self.quiet_keys.add(k)
            if not keys:
                del self.keys[source]

    def victim(self, source: str, max_series: int) -> SeriesKey | None:
        """The store is full: the series a new one of ``source`` replaces, or None (the new
        one is refused). A quiet series first; else, while ``source`` holds less than its
        fair share, one of the source holding the most."""
        if self.quiet_keys:
            return self.quiet_keys.pop()  # pop, not next(iter()): O(1) however many went
        sources = len(self.keys) + (source not in self.keys)
        share = max_series // max(1, sources)
        if not self.keys or self.count(source) >= share:
            return None
        big = self._over
        if big is None or self.count(big) <= share:  # the last one found is within its share
            big = self._over = max(self.keys, key=lambda s: len(self.keys[s]))
            if self.count(big) <= share:
                return None
        return self.keys[big].pop()
