"""A memory cgroup for the demo's worker: a real memory limit, as a container has.

The memory drills need a device whose size is known and a kernel that enforces
it: the worker runs in a child of the demo's own memory cgroup (v1 memory
controller or v2), entered by a ``sh`` wrapper before it ``exec``s the worker,
so a supervised respawn enters it again. The agent reads the limit as the
CPU engine's device memory total and the cgroup's ``oom_kill`` count as OOM
evidence: nothing is simulated. Creating one needs write access to the
cgroup tree (root, or a delegated subtree); without it the memory drills are
reported as not run.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path


def _write_if_present(path: Path, value: str) -> None:
    """Write a cgroup knob the kernel may lack (no swap accounting, no swap)."""
    if path.exists():
        with contextlib.suppress(OSError):
            path.write_text(value)


class NoCgroup(Exception):
    """No writable memory cgroup here; the message says why."""


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    v2: bool

    @property
    def limit_file(self) -> Path:
        return self.path / ("memory.max" if self.v2 else "memory.limit_in_bytes")

    def set_limit(self, limit_bytes: int) -> None:
        """Limit memory *and swap*: on a machine with swap the kernel would page the
        worker out past a RAM-only limit (v1 ``limit_in_bytes``, v2 ``memory.max``)
        instead of OOM-killing it, and the worker would crawl rather than die."""
        limit = str(int(limit_bytes))
        if self.v2:
            self.limit_file.write_text(limit)
            _write_if_present(self.path / "memory.swap.max", "0")
            return
        memsw = self.path / "memory.memsw.limit_in_bytes"
        # memory+swap may never be below memory: lift it, set memory, then pin it.
        _write_if_present(memsw, "-1")
        self.limit_file.write_text(limit)
        _write_if_present(memsw, limit)
        # Without swap accounting (no memsw file) a memcg's swappiness 0 keeps its
        # anonymous memory out of swap.
        _write_if_present(self.path / "memory.swappiness", "0")

    def limit_bytes(self) -> int | None:
        text = self.limit_file.read_text().strip()
        return int(text) if text.isdigit() and int(text) < 1 << 62 else None

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        for line in (self.path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def wrap(self, cmd: list[str]) -> list[str]:
        """``cmd`` entering this cgroup first; ``exec`` keeps the pid the supervisor knows."""
        procs = self.path / "cgroup.procs"
        return ["sh", "-c", f'echo $$ > "{procs}" && exec "$@"', "sh", *cmd]

    def remove(self, timeout_s: float = 10.0) -> None:
        """Remove the (emptied) cgroup; its processes must have exited."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.2)


def create(
    name: str,
    cgroup_root: Path = Path("/sys/fs/cgroup"),
    proc_cgroup: Path = Path("/proc/self/cgroup"),
) -> MemoryCgroup:
    """A new child of this process's memory cgroup, unlimited until :meth:`set_limit`.

    Raises :class:`NoCgroup` when there is no memory controller or it is not writable.
    """
    lines = proc_cgroup.read_text().splitlines()
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if "memory" in controllers.split(","):
            base, v2 = cgroup_root / "memory" / rel.lstrip("/"), False
            break
    else:
        v2_rel = next((ln.split(":", 2)[2] for ln in lines if ln.startswith("0::")), None)
        if v2_rel is None or not (cgroup_root / "cgroup.controllers").exists():
            raise NoCgroup("no memory cgroup controller mounted")
        base, v2 = cgroup_root / v2_rel.lstrip("/"), True
        ctl = base / "cgroup.subtree_control"
        if "memory" not in ctl.read_text().split():
            with contextlib.suppress(OSError):
                ctl.write_text("+memory")
    path = base / name
    try:
        path.mkdir()
    except OSError as exc:
        raise NoCgroup(f"cannot create {path}: {exc.strerror}") from None
    cg = MemoryCgroup(path, v2)
    if not cg.limit_file.exists() or not os.access(cg.limit_file, os.W_OK):
        cg.remove(0)
        raise NoCgroup(f"{path} has no writable memory limit")
    return cg
