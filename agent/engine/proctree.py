"""The engine's process group as ``/proc`` shows it: members, their command lines.

The supervisor starts the engine in its own session, so the group id is the
root's pid and every process the engine forks is a member unless it calls
``setsid`` itself. A zombie is not a member: it holds no memory and no mapping,
and where the agent is PID 1 orphaned zombies may never be reaped. Every
function takes ``proc_root``; a process that exits while it is read is skipped.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: str, proc_root: Path) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        raw = (proc_root / pid / "stat").read_bytes()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces or ')'.
    end = raw.rfind(b")")
    return raw[end + 2 :].decode(errors="replace").split() if end > 0 else None


def group_pids(pgid: int, proc_root: Path = PROC) -> list[int]:
    """Pids of the live (not zombie) members of process group ``pgid``."""
    try:
        names = [p for p in os.listdir(proc_root) if p.isdigit()]
    except OSError:
        return []
    out = []
    for name in names:
        fields = _stat_fields(name, proc_root)
        # fields: state, ppid, pgrp, ...
        if fields is None or len(fields) < 3 or fields[0] in ("Z", "X"):
            continue
        if fields[2] == str(pgid):
            out.append(int(name))
    return sorted(out)


def alive(pid: int, proc_root: Path = PROC) -> bool:
    """True while ``pid`` exists and is not a zombie (a zombie has exited)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(str(pid), proc_root)
    return fields is None or fields[0] not in ("Z", "X")


def cmdline(pid: int, proc_root: Path = PROC) -> list[str]:
    """The argv of ``pid`` (empty when it is gone or unreadable)."""
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def pgid_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


# /proc/<pid>/stat's state letters, in words (man 5 proc).
STATES = {
    "R": "running", "S": "sleeping", "D": "uninterruptible (in the kernel)", "T": "stopped",
    "t": "traced", "Z": "zombie", "X": "dead", "I": "idle", "W": "paging",
}  # fmt: skip


def state(pid: int, proc_root: Path = PROC) -> str | None:
    """``pid``'s state letter (``R``, ``S``, ``D``, ``T``, ...), None when it is gone."""
    fields = _stat_fields(str(pid), proc_root)
    return fields[0] if fields else None


def describe(pid: int, proc_root: Path = PROC) -> str:
    """``pid`` as a page names it: its state (and a frozen cgroup), its command."""
    fields = _stat_fields(str(pid), proc_root)
    state = STATES.get(fields[0], fields[0]) if fields else "gone"
    if frozen(pid, proc_root):
        state += ", cgroup frozen"
    cmd = " ".join(cmdline(pid, proc_root))[:80]
    return f"{pid} ({state}: {cmd})" if cmd else f"{pid} ({state})"


def frozen(pid: int, proc_root: Path = PROC) -> bool:
    """True when ``pid``'s freezer cgroup (v1) or its cgroup (v2) is frozen: such a process
    takes no signal, SIGKILL included, until it is thawed."""
    try:
        lines = (proc_root / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return False
    base = Path("/sys/fs/cgroup")
    for line in lines:  # a hybrid host has both: frozen by either is frozen
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        found: list[tuple[Path, tuple[str, ...]]]
        if "freezer" in controllers.split(","):
            found = [(base / "freezer" / rel / "freezer.state", ("FROZEN", "FREEZING"))]
        elif controllers == "":  # v2: at the root, or under unified/ on a hybrid host
            found = [(b / rel / "cgroup.events", ("frozen 1",)) for b in (base, base / "unified")]
        else:
            continue
        for knob, marks in found:
            with contextlib.suppress(OSError):
                if any(m in knob.read_text() for m in marks):
                    return True
    return False
