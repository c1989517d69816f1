"""The engine's memory cgroup: its limit and its OOM-kill count.

cgroup v2 (``0::/path`` in ``/proc/<pid>/cgroup``; ``memory.max``,
``memory.events``) and, on hybrid hosts, the v1 memory controller
(``memory.limit_in_bytes``, ``memory.oom_control``). Inside a container the
path printed by the kernel often does not exist under the container's own
mount, whose root *is* the container's cgroup; the mount root is used then.
Roots are parameters so tests feed captured trees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# cgroup v1 reports "no limit" as a page-rounded LONG_MAX.
_V1_UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Cgroup:
    v2: Path | None = None  # the cgroup's directory under the v2 mount
    v2_root: Path | None = None
    v1_memory: Path | None = None  # the cgroup's directory under the v1 memory mount
    v1_root: Path | None = None


def _under(root: Path, rel: str) -> Path:
    p = root / rel.lstrip("/")
    return p if p.is_dir() else root


def find(
    pid: int, proc_root: Path | str = "/proc", cgroup_root: Path | str = "/sys/fs/cgroup"
) -> Cgroup:
    """The memory cgroup of ``pid``; fields are None where not readable."""
    proc_root, cgroup_root = Path(proc_root), Path(cgroup_root)
    try:
        lines = (proc_root / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return Cgroup()
    v2 = v2_root = v1 = v1_root = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if controllers == "":
            for root in (cgroup_root, cgroup_root / "unified"):
                if (root / "cgroup.controllers").exists():
                    v2_root = root
                    v2 = _under(root, rel)
                    break
        elif "memory" in controllers.split(","):
            root = cgroup_root / "memory"
            if root.is_dir():
                v1_root, v1 = root, _under(root, rel)
    return Cgroup(v2, v2_root, v1, v1_root)


def _read(p: Path) -> str | None:
    try:
        return p.read_text()
    except OSError:
        return None


def _chain(d: Path, root: Path) -> list[Path]:
    out = [d]
    while d != root and root in d.parents:
        d = d.parent
        out.append(d)
    return out


def memory_limit_bytes(cg: Cgroup) -> int | None:
    """The tightest memory limit on the cgroup and its ancestors, or None when unlimited."""
    limits: list[int] = []
    if cg.v2 is not None and cg.v2_root is not None:
        for d in _chain(cg.v2, cg.v2_root):
            text = _read(d / "memory.max")
            if text is not None and text.strip().isdigit():
                limits.append(int(text.strip()))
    if cg.v1_memory is not None and cg.v1_root is not None:
        for d in _chain(cg.v1_memory, cg.v1_root):
            text = _read(d / "memory.limit_in_bytes")
            if text is not None and text.strip().isdigit() and int(text.strip()) < _V1_UNLIMITED:
                limits.append(int(text.strip()))
    return min(limits) if limits else None


def oom_kills(cg: Cgroup) -> int | None:
    """The kernel's count of OOM kills in the cgroup (``oom_kill``), or None when unreadable."""
    for d, fname in ((cg.v2, "memory.events"), (cg.v1_memory, "memory.oom_control")):
        if d is None:
            continue
        text = _read(d / fname)
        if text is None:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value.strip())
    return None
