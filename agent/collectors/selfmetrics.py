"""The agent's own resources: RSS, CPU seconds, tick duration histogram.

Read from the kernel directly (``getrusage`` and ``/proc/self/statm``): psutil
costs ~0.9 MiB at import and is loaded only where the engine's process tree
needs it (or here, where ``/proc`` is missing).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from kcops import __version__
from kcops.agent.samples import Sample, histogram_samples
from kcops.agent.store import Store
from kcops.errors import CollectorUnavailable
from kcops.histogram import Histogram

if TYPE_CHECKING:
    import psutil

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

# Tick durations are milliseconds in a healthy agent; buckets reach the full tick.
TICK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def tick_histogram() -> Histogram:
    """An empty histogram of tick durations (the one histogram type, with tick buckets)."""
    return Histogram(TICK_BUCKETS_S)


class RegexCacheStats(Protocol):
    """A bounded cache's size, bound and evictions (the rules' and queries' compiled
    regexes, kcops.agent.promql.regex.CACHE, handed in by the app)."""

    bytes: int
    max_bytes: int
    evictions: int

    def __len__(self) -> int: ...


class SelfCollector:
    """RSS and CPU of the agent process, the tick histogram, the store's and the regex
    cache's bounds."""

    name = "self"

    def __init__(
        self,
        ticks: Histogram,
        proc: psutil.Process | None = None,
        store: Store | None = None,
        regex_cache: RegexCacheStats | None = None,
    ) -> None:
        self.ticks = ticks
        self.proc = proc
        self.store = store
        self.regex_cache = regex_cache

    def _rss_cpu(self) -> tuple[int, float]:
        """Resident bytes and CPU seconds (user + system, all threads) of this process."""
        if self.proc is None:
            try:
                with open("/proc/self/statm", "rb") as fh:
                    rss = int(fh.read().split()[1]) * PAGE_BYTES
                use = resource.getrusage(resource.RUSAGE_SELF)
                return rss, use.ru_utime + use.ru_stime
            except FileNotFoundError:  # no /proc (not Linux): psutil after all
                import psutil

                self.proc = psutil.Process(os.getpid())
        with self.proc.oneshot():
            cpu = self.proc.cpu_times()
            return self.proc.memory_info().rss, cpu.user + cpu.system

    def collect(self, now: float) -> Iterable[Sample]:
        try:
            rss, cpu = self._rss_cpu()
        except OSError as exc:  # EMFILE: no descriptor left to read /proc with
            raise CollectorUnavailable(
                f"cannot read this process's memory and CPU: {exc.strerror or exc}", reason="read"
            ) from None
        labels = {"process": "agent"}
        out = [
            Sample.of("kcops_process_resident_memory_bytes", rss, labels),
            Sample.of("kcops_process_cpu_seconds_total", cpu, labels),
            Sample.of("kcops_agent_build_info", 1, {"version": __version__}),
        ]
        histogram_samples("kcops_agent_tick_seconds", self.ticks, (), out)
        if self.store is not None:
            st = self.store
            out.append(Sample.of("kcops_store_bytes", st.bytes_estimate))
            out.append(Sample.of("kcops_store_max_bytes", st.max_bytes))
            for reason, n in (
                ("max_series", st.dropped_series),
                ("source_budget", st.over_budget),
                ("max_bytes", st.refused_series),
                ("out_of_order", st.dropped_out_of_order),
            ):
                out.append(Sample.of("kcops_store_dropped_samples_total", n, {"reason": reason}))
            out.append(Sample.of("kcops_store_evicted_samples_total", st.evicted_samples))
            for source, n in sorted(st.quotas.refused.items()):
                out.append(
                    Sample.of("kcops_store_source_refused_samples_total", n, {"source": source})
                )
        rx = self.regex_cache
        if rx is not None:
            out.append(Sample.of("kcops_regex_cache_bytes", rx.bytes))
            out.append(Sample.of("kcops_regex_cache_entries", len(rx)))
            out.append(Sample.of("kcops_regex_cache_max_bytes", rx.max_bytes))
            out.append(Sample.of("kcops_regex_cache_evictions_total", rx.evictions))
        return out
