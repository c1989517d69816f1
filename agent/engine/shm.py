"""POSIX shared memory an engine's process tree left behind in ``/dev/shm``.

An engine killed before it can unlink its segments (vLLM's ~419 MB of
``psm_*`` per SIGKILL) leaks them until reboot. The supervisor snapshots the
directory before each spawn and, once the whole tree is gone, removes only
entries that appeared during that engine's life, belong to the agent's user,
and that no live process still has open or mapped (``/proc/*/fd``,
``/proc/*/maps``): never someone else's.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("kcops.agent.engine.shm")

SHM_ROOT = Path("/dev/shm")


def snapshot(root: Path = SHM_ROOT) -> set[str]:
    try:
        return {e.name for e in os.scandir(root) if e.is_file(follow_symlinks=False)}
    except OSError:
        return set()


def in_use(root: Path = SHM_ROOT, proc_root: Path = Path("/proc")) -> set[str]:
    """Names under ``root`` that some live process has open or mapped."""
    prefix = str(root).rstrip("/") + "/"
    used: set[str] = set()
    try:
        pids = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return used
    for pid in pids:
        base = proc_root / pid
        try:
            for fd in os.listdir(base / "fd"):
                try:
                    target = os.readlink(base / "fd" / fd)
                except OSError:
                    continue
                if target.startswith(prefix):
                    used.add(target[len(prefix) :].removesuffix(" (deleted)"))
        except OSError:
            pass
        try:
            with open(base / "maps", "rb") as fh:
                for line in fh:
                    i = line.find(prefix.encode())
                    if i >= 0:
                        name = line[i + len(prefix) :].strip().decode(errors="replace")
                        used.add(name.removesuffix(" (deleted)"))
        except OSError:
            pass
    return used


def cleanup(before: set[str], root: Path = SHM_ROOT, proc_root: Path = Path("/proc")) -> list[str]:
    """Remove entries new since ``before``, ours, and not in use by anyone; returns them."""
    new = snapshot(root) - before
    if not new:
        return []
    busy = in_use(root, proc_root)
    uid = os.getuid()
    removed = []
    for name in sorted(new - busy):
        path = root / name
        try:
            if path.lstat().st_uid != uid:
                continue
            path.unlink()
        except OSError:
            continue
        removed.append(name)
    if removed:
        log.warning("removed %d shared memory entries the engine left: %s", len(removed), removed)
    return removed
