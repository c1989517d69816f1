"""Device memory of a CPU engine: its process tree's RSS against its limit.

The limit is the engine cgroup's memory limit where one is set (the tightest
of the cgroup and its ancestors; v2 ``memory.max``, v1 fallback), else the
configured ``collectors.device_memory.limit_bytes``, else the host's total
memory. Exported as ``kcops_device_memory_*{device="cpu"}`` so the device
memory alert and its remediation work the same for the reference worker.
"""

from __future__ import annotations

from collections.abc import Callable

from kcops.agent.collectors import cgroup
from kcops.agent.collectors.process import require_tree
from kcops.agent.collectors.procwatch import EngineWatch
from kcops.agent.samples import Sample, label_pairs

CPU = label_pairs({"device": "cpu"})


def _host_total() -> int:
    import psutil  # only an agent that watches a CPU engine's memory pays its import

    return int(psutil.virtual_memory().total)


class CpuDeviceMemoryCollector:
    name = "device_memory_cpu"

    def __init__(
        self,
        watch: EngineWatch,
        *,
        limit_bytes: int | None = None,
        host_total: Callable[[], int] | None = None,
        limit_refresh_s: float = 10.0,
    ) -> None:
        self.watch = watch
        self.limit_bytes = limit_bytes
        self.host_total = host_total or _host_total
        self.limit_refresh_s = limit_refresh_s
        self.limit_source: str | None = None
        self._limit: int | None = None
        self._limit_at = float("-inf")
        self._limit_pid: int | None = None

    def _current_limit(self, pid: int, now: float) -> int:
        if (
            pid == self._limit_pid
            and self._limit is not None
            and now - self._limit_at < self.limit_refresh_s
        ):
            return self._limit
        cg = cgroup.find(pid, self.watch.proc_root, self.watch.cgroup_root)
        limit = cgroup.memory_limit_bytes(cg)
        source = "cgroup"
        if limit is None and self.limit_bytes is not None:
            limit, source = self.limit_bytes, "config"
        if limit is None:
            limit, source = self.host_total(), "host"
        self._limit, self._limit_at, self._limit_pid, self.limit_source = limit, now, pid, source
        return limit

    def collect(self, now: float) -> list[Sample]:
        snap = require_tree(self.watch, now)
        if snap is None:
            return []
        total = self._current_limit(snap.root_pid, now)
        return [
            Sample("kcops_device_memory_used_bytes", CPU, float(snap.rss_bytes)),
            Sample("kcops_device_memory_total_bytes", CPU, float(total)),
        ]
