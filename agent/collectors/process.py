"""The engine process tree: resources, and its life (up, restarts, OOM exits).

Two collectors over one :class:`~kcops.agent.collectors.procwatch.EngineWatch`:

- ``process`` exports RSS, CPU seconds, threads and open fds of the whole tree
  under ``process="engine"``; with no pid known, or the pid gone, it raises
  :class:`CollectorUnavailable` (counted, series go stale).
- ``engine_events`` never fails once a pid has been known, since its
  ``kcops_process_up``, ``kcops_engine_oom_total`` and (for an engine the agent
  does not supervise) ``kcops_engine_restarts_total`` must survive the very exit
  they count. A restart seen here (a new engine pid) is a new start of the
  engine's lifecycle, so ``KcopsEngineDown`` does not count the reload.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcops.agent.collectors.procwatch import EngineWatch, TreeSnapshot
from kcops.agent.engine import lifecycle as lc
from kcops.agent.samples import Sample, label_pairs
from kcops.errors import CollectorUnavailable

if TYPE_CHECKING:
    from kcops.agent.engine import Engine

ENGINE = label_pairs({"process": "engine"})


def require_tree(watch: EngineWatch, now: float) -> TreeSnapshot | None:
    """The tree snapshot, or :class:`CollectorUnavailable` saying why there is none.

    None (no samples, no error) while the only possible source of a pid is one
    that may answer later (the kcops worker's /admin/state).
    """
    snap = watch.observe(now)
    if snap is not None:
        return snap
    if watch.status == "no_pid":
        if not (watch.pids.configured or watch.pids.supervised()):
            return None
        raise CollectorUnavailable(
            "no engine pid known (set engine.pid or engine.pidfile, or run the engine "
            "under the agent with `-- CMD`)",
            reason="no_pid",
        )
    pid = watch.exits[-1].pid if watch.exits else watch.pids.resolve()
    raise CollectorUnavailable(f"engine process {pid} is gone", reason="process_gone")


class ProcessCollector:
    name = "process"

    def __init__(self, watch: EngineWatch) -> None:
        self.watch = watch

    def collect(self, now: float) -> list[Sample]:
        snap = require_tree(self.watch, now)
        if snap is None:
            return []
        out = [
            Sample("kcops_process_resident_memory_bytes", ENGINE, float(snap.rss_bytes)),
            Sample("kcops_process_cpu_seconds_total", ENGINE, snap.cpu_seconds),
            Sample("kcops_process_threads", ENGINE, float(snap.threads)),
        ]
        if snap.open_fds is not None:
            out.append(Sample("kcops_process_open_fds", ENGINE, float(snap.open_fds)))
        return out


class EngineEventsCollector:
    name = "engine_events"

    def __init__(self, watch: EngineWatch, engine: Engine | None = None) -> None:
        self.watch = watch
        self.engine = engine
        self._restarts_seen = watch.restarts_seen

    def collect(self, now: float) -> list[Sample]:
        self.watch.observe(now)
        w = self.watch
        if w.restarts_seen != self._restarts_seen:
            self._restarts_seen = w.restarts_seen
            if self.engine is not None and not w.pids.supervised():
                self.engine.observe(lc.Spawned(now))  # the supervisor says so itself
        if not w.ever_known:
            return []
        out = [
            Sample("kcops_process_up", ENGINE, 1.0 if w.status == "up" else 0.0),
            Sample("kcops_engine_oom_total", (), float(w.oom_total)),
        ]
        if not w.pids.supervised():
            out.append(Sample("kcops_engine_restarts_total", (), float(w.restarts_seen)))
        return out
