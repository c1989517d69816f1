"""Watches the engine's process tree once per tick, for several collectors.

One :class:`EngineWatch` per agent reads the tree (root pid from
:class:`~kcops.agent.engine.pid.EnginePid`, children through psutil)
and keeps what outlives a single read: CPU seconds kept monotonic across the
exit of tree members and engine restarts, restarts seen, and exits by OOM.

An exit counts as out-of-memory only with evidence: the engine cgroup's
``oom_kill`` count rose (the kernel raises it as it sends the SIGKILL), the
kernel log has ``Killed process <pid>``, or the engine's own log
(``engine.log_path``) gained an out-of-memory error since the previous read. A
SIGKILL with none of these is a kill, recorded with empty evidence.
"""

from __future__ import annotations

import logging
import os
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kcops.agent.collectors import cgroup
from kcops.agent.engine.pid import EnginePid

if TYPE_CHECKING:
    import psutil

log = logging.getLogger("kcops.agent.collectors.procwatch")

OOM_LOG_PATTERN = re.compile(
    rb"CUDA out of memory|OutOfMemoryError|out of memory|MemoryError|"
    rb"Cannot allocate memory|std::bad_alloc",
    re.IGNORECASE,
)


def _process(pid: int) -> psutil.Process:
    # psutil (~0.9 MiB) is imported once there is an engine process to watch.
    import psutil

    return psutil.Process(pid)


@dataclass(frozen=True)
class TreeSnapshot:
    root_pid: int
    pids: tuple[int, ...]
    rss_bytes: int
    cpu_seconds: float  # monotonic: includes exited members and earlier engine processes
    threads: int
    open_fds: int | None  # None when not readable for some member


@dataclass(frozen=True)
class ExitRecord:
    pid: int
    at: float
    root: bool
    oom: bool
    evidence: str


class EngineWatch:
    """The engine process tree, read at most once per ``now``."""

    def __init__(
        self,
        pids: EnginePid,
        *,
        proc_root: Path | str = "/proc",
        cgroup_root: Path | str = "/sys/fs/cgroup",
        log_path: Path | str | None = None,
        log_tail_bytes: int = 65_536,
        kmsg_path: Path | str | None = "/dev/kmsg",
        children_every: int = 5,
        process_factory: Callable[[int], psutil.Process] | None = None,
    ) -> None:
        self.pids = pids
        self.proc_root = Path(proc_root)
        self.cgroup_root = Path(cgroup_root)
        self.log_path = Path(log_path) if log_path is not None else None
        self.log_tail_bytes = log_tail_bytes
        self.kmsg_path = Path(kmsg_path) if kmsg_path is not None else None
        self.children_every = max(1, children_every)
        self._new_process = process_factory or _process

        self.status = "no_pid"  # no_pid | up | gone
        self.ever_known = False
        self.oom_total = 0
        self.restarts_seen = 0
        self.exits: deque[ExitRecord] = deque(maxlen=20)

        self._at: float | None = None
        self._snap: TreeSnapshot | None = None
        self._root_pid: int | None = None
        self._root_alive = False
        self._procs: dict[int, psutil.Process] = {}
        self._reads = 0
        self._cpu_last: dict[int, float] = {}
        self._cpu_dead = 0.0
        self._cg: cgroup.Cgroup | None = None
        self._oom_seen: int | None = None
        self._oom_carry = 0
        self._log_offset: int | None = None
        self._kmsg_ok = kmsg_path is not None

    # -- public --------------------------------------------------------------

    def observe(self, now: float) -> TreeSnapshot | None:
        """The tree at ``now`` (None when no engine pid is known or it is gone)."""
        if self._at == now:
            return self._snap
        self._at = now
        self._snap = self._observe(now)
        return self._snap

    def pid_set(self) -> set[int]:
        return set(self._snap.pids) if self._snap is not None else set()

    # -- internals -----------------------------------------------------------

    def _observe(self, now: float) -> TreeSnapshot | None:
        if self._log_offset is None:
            self._log_offset = self._log_size()
        pid = self.pids.resolve()
        exits: list[tuple[int, bool]] = []  # (pid, is_root)
        if self._root_pid is not None and pid != self._root_pid:
            if self._root_alive and not self._alive(self._root_pid):
                exits.append((self._root_pid, True))
            if pid is not None:
                self.restarts_seen += 1
            self._switch_root()
        if pid is None:
            self.status = "gone" if self.ever_known else "no_pid"
            self._finish_exits(exits, now)
            return None
        self.ever_known = True
        if pid != self._root_pid:
            self._root_pid = pid
            self._root_alive = False
            self._cg = None
        snap = self._read_tree(pid, exits)
        if snap is None:
            if self._root_alive:
                exits.append((pid, True))
            self._root_alive = False
            self.status = "gone"
        else:
            self._root_alive = True
            self.status = "up"
        self._finish_exits(exits, now)
        return snap

    def _switch_root(self) -> None:
        for p, cpu in self._cpu_last.items():
            self._cpu_dead += cpu
            self._procs.pop(p, None)
        self._cpu_last = {}
        self._root_pid = None
        self._root_alive = False

    def _alive(self, pid: int) -> bool:
        import psutil

        p = self._procs.get(pid)
        try:
            return p.is_running() if p is not None else psutil.pid_exists(pid)
        except psutil.Error:
            return False

    def _tree(self, pid: int) -> list[psutil.Process]:
        root = self._procs.get(pid)
        if root is None or not root.is_running():
            root = self._new_process(pid)  # raises NoSuchProcess
            self._procs = {pid: root}
            self._reads = 0
        if self._reads % self.children_every == 0:
            kids = root.children(recursive=True)
            self._procs = {pid: root, **{k.pid: self._procs.get(k.pid, k) for k in kids}}
        self._reads += 1
        return list(self._procs.values())

    def _read_tree(self, pid: int, exits: list[tuple[int, bool]]) -> TreeSnapshot | None:
        import psutil

        try:
            procs = self._tree(pid)
        except psutil.NoSuchProcess:
            self._procs.pop(pid, None)
            return None
        except psutil.AccessDenied as exc:
            log.warning("engine pid %s: access denied (%s)", pid, exc)
            return None
        if self._cg is None:
            self._cg = cgroup.find(pid, self.proc_root, self.cgroup_root)
        rss = threads = 0
        fds: int | None = 0
        live: dict[int, float] = {}
        for p in procs:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    live[p.pid] = t.user + t.system
                    threads += p.num_threads()
                    try:
                        if fds is not None:
                            fds += p.num_fds()
                    except psutil.AccessDenied:
                        fds = None
            except psutil.NoSuchProcess:
                self._procs.pop(p.pid, None)
                if p.pid == pid:
                    return None
            except psutil.AccessDenied:
                fds = None
        for gone in set(self._cpu_last) - set(live):
            self._cpu_dead += self._cpu_last[gone]
            if gone != pid:
                exits.append((gone, False))
        self._cpu_last = live
        return TreeSnapshot(
            root_pid=pid,
            pids=tuple(live),
            rss_bytes=rss,
            cpu_seconds=self._cpu_dead + sum(live.values()),
            threads=threads,
            open_fds=fds,
        )

    # -- OOM evidence ----------------------------------------------------------

    def _finish_exits(self, exits: list[tuple[int, bool]], now: float) -> None:
        delta = 0
        if self._cg is not None:
            cur = cgroup.oom_kills(self._cg)
            if cur is not None:
                if self._oom_seen is not None and cur > self._oom_seen:
                    delta = cur - self._oom_seen
                self._oom_seen = cur
        avail = self._oom_carry + delta
        new_log = self._new_log_bytes() if exits else b""
        for pid, is_root in exits:
            evidence = ""
            if avail > 0:
                avail -= 1
                evidence = "cgroup oom_kill"
            elif self._kmsg_says_killed(pid):
                evidence = "kernel log"
            elif new_log and OOM_LOG_PATTERN.search(new_log):
                evidence = "engine log"
                new_log = b""  # one log line explains one exit
            oom = bool(evidence)
            if oom:
                self.oom_total += 1
            if oom or is_root:
                log.warning(
                    "engine process %s exited%s",
                    pid,
                    f" by out-of-memory ({evidence})" if oom else "",
                )
            self.exits.append(ExitRecord(pid, now, is_root, oom, evidence))
        # A kill counted just before the exit became visible matches on the next read.
        self._oom_carry = min(avail, delta)

    def _log_size(self) -> int:
        if self.log_path is None:
            return 0
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def _new_log_bytes(self) -> bytes:
        if self.log_path is None:
            return b""
        size = self._log_size()
        start = self._log_offset or 0
        if size < start:  # rotated or truncated
            start = 0
        start = max(start, size - self.log_tail_bytes)
        self._log_offset = size
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(start)
                return fh.read(size - start)
        except OSError:
            return b""

    def _kmsg_says_killed(self, pid: int) -> bool:
        if not self._kmsg_ok or self.kmsg_path is None:
            return False
        needles = (f"Killed process {pid} ".encode(), f",pid={pid},".encode())
        try:
            fd = os.open(self.kmsg_path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            self._kmsg_ok = False  # not readable here (dmesg_restrict, no privilege)
            return False
        try:
            for _ in range(50_000):
                try:
                    rec = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except OSError:  # EPIPE: a record was overwritten while reading
                    continue
                if not rec:
                    break
                if any(n in rec for n in needles) and b"emory" in rec:
                    return True
        finally:
            os.close(fd)
        return False
