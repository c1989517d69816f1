"""The agent's own resources: RSS, CPU seconds, tick duration histogram."""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil

from kcops import __version__
from kcops.agent.samples import Sample, histogram_samples
from kcops.agent.store import Store
from kcops.kernels.wire import Histogram

# Tick durations are milliseconds in a healthy agent; buckets reach the full tick.
TICK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def tick_histogram() -> Histogram:
    """An empty histogram of tick durations (the one histogram type, with tick buckets)."""
    return Histogram(TICK_BUCKETS_S)


class SelfCollector:
    """RSS and CPU of the agent process, and the tick histogram."""

    name = "self"

    def __init__(
        self, ticks: Histogram, proc: psutil.Process | None = None, store: Store | None = None
    ) -> None:
        self.ticks = ticks
        self.proc = proc or psutil.Process(os.getpid())
        self.store = store

    def collect(self, now: float) -> Iterable[Sample]:
        with self.proc.oneshot():
            rss = self.proc.memory_info().rss
            cpu = self.proc.cpu_times()
        labels = {"process": "agent"}
        out = [
            Sample.of("kcops_process_resident_memory_bytes", rss, labels),
            Sample.of("kcops_process_cpu_seconds_total", cpu.user + cpu.system, labels),
            Sample.of("kcops_agent_build_info", 1, {"version": __version__}),
        ]
        histogram_samples("kcops_agent_tick_seconds", self.ticks, (), out)
        if self.store is not None:
            st = self.store
            out.append(Sample.of("kcops_store_bytes", st.bytes_estimate))
            out.append(Sample.of("kcops_store_max_bytes", st.max_bytes))
            for reason, n in (
                ("max_series", st.dropped_series),
                ("max_bytes", st.refused_series),
                ("out_of_order", st.dropped_out_of_order),
            ):
                out.append(Sample.of("kcops_store_dropped_samples_total", n, {"reason": reason}))
            out.append(Sample.of("kcops_store_evicted_samples_total", st.evicted_samples))
        return out
