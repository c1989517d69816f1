"""POSIX shared memory an engine's process tree left behind in ``/dev/shm``.

An engine killed before it can unlink its segments (vLLM's ~419 MB of
``psm_*`` per SIGKILL) leaks them until reboot. What is removed is decided by
what the engine's own tree held, never by "new and unused": the supervisor
snapshots the directory before each spawn, records what the process group has
open or mapped while it runs (:func:`held_by`), and once the group is gone
removes an entry only when the tree held that very file (name and inode), it
was not there before the spawn, it is the agent user's, and no live process
holds it (:func:`cleanup`). A segment another process created is never touched;
the price is that one the tree created and lost between two scans is left.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

log = logging.getLogger("kcops.agent.engine.shm")

SHM_ROOT = Path("/dev/shm")
PROC = Path("/proc")

# name -> inode of a file directly under the shared memory root
Entries = dict[str, int]


def snapshot(root: Path = SHM_ROOT) -> Entries:
    """The files directly under ``root`` now, by name and inode."""
    try:
        return {e.name: e.inode() for e in os.scandir(root) if e.is_file(follow_symlinks=False)}
    except OSError:
        return {}


def _name(path: str, prefix: str) -> str | None:
    """The entry name of ``path`` when it is a live file directly under the root."""
    if not path.startswith(prefix) or path.endswith(" (deleted)"):
        return None
    name = path[len(prefix) :]
    return name if name and "/" not in name else None


def _held(pid: str, prefix: str, proc_root: Path) -> Iterator[tuple[str, int]]:
    """(name, inode) of each entry under the root that ``pid`` has open or mapped."""
    fd_dir = proc_root / pid / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        fds = []
    for fd in fds:
        try:
            name = _name(os.readlink(fd_dir / fd), prefix)
            if name is not None:
                yield name, os.stat(fd_dir / fd).st_ino
        except OSError:
            continue
    try:
        with open(proc_root / pid / "maps", "rb") as fh:
            lines = [ln for ln in fh if prefix.encode() in ln]
    except OSError:
        return
    for line in lines:
        # address perms offset dev inode path
        parts = line.decode(errors="replace").rstrip("\n").split(None, 5)
        if len(parts) == 6 and parts[4].isdigit():
            name = _name(parts[5], prefix)
            if name is not None:
                yield name, int(parts[4])


def _prefix(root: Path) -> str:
    return str(root).rstrip("/") + "/"


def held_by(pids: Iterable[int], root: Path = SHM_ROOT, proc_root: Path = PROC) -> Entries:
    """Entries under ``root`` that the processes ``pids`` have open or mapped now."""
    prefix = _prefix(root)
    out: Entries = {}
    for pid in pids:
        out.update(_held(str(pid), prefix, proc_root))
    return out


def in_use(root: Path = SHM_ROOT, proc_root: Path = PROC) -> set[tuple[str, int]]:
    """(name, inode) of the entries under ``root`` that any live process holds."""
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return set()
    prefix = _prefix(root)
    return {held for pid in pids for held in _held(pid, prefix, proc_root)}


def cleanup(
    before: Entries, seen: Entries, root: Path = SHM_ROOT, proc_root: Path = PROC
) -> list[str]:
    """Remove what the engine's tree held (``seen``) and left; returns the names removed.

    Call it once the tree is gone. ``before``: the snapshot taken before the spawn.
    """
    now = snapshot(root)
    wanted = {n: i for n, i in seen.items() if now.get(n) == i and before.get(n) != i}
    if not wanted:
        return []
    busy = in_use(root, proc_root)
    uid = os.getuid()
    removed = []
    for name, inode in sorted(wanted.items()):
        if (name, inode) in busy:
            continue
        path = root / name
        try:
            st = path.lstat()
            if st.st_uid != uid or st.st_ino != inode:
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(name)
    if removed:
        log.warning("removed %d shared memory entries the engine left: %s", len(removed), removed)
    return removed


class Ledger:
    """The shared memory of one engine generation: the snapshot before its spawn and
    what its process group was seen holding while it ran."""

    def __init__(self, root: Path = SHM_ROOT, proc_root: Path = PROC, every_s: float = 5.0):
        self.root = root
        self.proc_root = proc_root
        self.every_s = every_s
        self.before: Entries = {}
        self.seen: Entries = {}
        self._last: float | None = None

    def spawning(self) -> None:
        """A new generation starts: forget the last one (it was reaped)."""
        self.before = snapshot(self.root)
        self.seen = {}
        self._last = None

    def due(self, now_s: float) -> bool:
        """True when the last look is ``every_s`` old or more (monotonic ``now_s``)."""
        return self._last is None or now_s - self._last >= self.every_s

    def scan(self, pids: Iterable[int], now_s: float) -> None:
        """Record what ``pids`` hold now."""
        self._last = now_s
        self.seen.update(held_by(pids, self.root, self.proc_root))

    def reap(self) -> list[str]:
        """Remove what this generation held and left (call once its tree is gone)."""
        removed = cleanup(self.before, self.seen, self.root, self.proc_root)
        self.seen = {n: i for n, i in self.seen.items() if n not in removed}
        return removed
