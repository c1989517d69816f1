"""The agent's own resources: RSS, CPU seconds, tick duration histogram."""

from __future__ import annotations

import os
from collections.abc import Iterable

import psutil

from kcops import __version__
from kcops.agent.samples import Sample

# Tick durations are milliseconds in a healthy agent; buckets reach the full tick.
TICK_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class TickHistogram:
    """Cumulative histogram of tick durations, fed by the app after each tick."""

    def __init__(self, buckets: tuple[float, ...] = TICK_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        for i, b in enumerate(self.buckets):
            if seconds <= b:
                self.counts[i] += 1

    def samples(self, name: str) -> list[Sample]:
        out = [
            Sample.of(f"{name}_bucket", c, {"le": _le(b)})
            for b, c in zip(self.buckets, self.counts, strict=True)
        ]
        out.append(Sample.of(f"{name}_bucket", self.count, {"le": "+Inf"}))
        out.append(Sample.of(f"{name}_sum", self.sum))
        out.append(Sample.of(f"{name}_count", self.count))
        return out


def _le(b: float) -> str:
    return repr(float(b))


class SelfCollector:
    """RSS and CPU of the agent process, and the tick histogram."""

    name = "self"

    def __init__(self, ticks: TickHistogram, proc: psutil.Process | None = None) -> None:
        self.ticks = ticks
        self.proc = proc or psutil.Process(os.getpid())

    def collect(self, now: float) -> Iterable[Sample]:
        with self.proc.oneshot():
            rss = self.proc.memory_info().rss
            cpu = self.proc.cpu_times()
        labels = {"process": "agent"}
        return [
            Sample.of("kcops_process_resident_memory_bytes", rss, labels),
            Sample.of("kcops_process_cpu_seconds_total", cpu.user + cpu.system, labels),
            Sample.of("kcops_agent_build_info", 1, {"version": __version__}),
            *self.ticks.samples("kcops_agent_tick_seconds"),
        ]
