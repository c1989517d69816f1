"""What ``/proc`` says of each process of the engine's tree, read without stopping it.

Per process: state (and a frozen cgroup), wchan, threads, RSS, open fds, CPU seconds, and
a role named from its command line. A process that exits while it is read is reported
with what was read; nothing here sends a signal or attaches to anything.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import psutil

from kcops.agent.engine import proctree

# Roles by what the command line holds, first match wins (vLLM names its core process).
ROLES = (
    ("EngineCore", "EngineCore"),
    ("VLLM::Worker", "vLLM worker"),
    ("vllm serve", "API server"),
    ("vllm.entrypoints", "API server"),
    ("kcops serve", "kcops worker"),
    ("kcops.worker", "kcops worker"),
)


def tree(root: int) -> list[int]:
    """``root`` and its descendants, living ones only (a zombie holds no stack)."""
    try:
        proc = psutil.Process(root)
        kids = proc.children(recursive=True)
    except psutil.Error:
        return []
    return [p.pid for p in [proc, *kids] if proctree.alive(p.pid)]


def role(cmd: str, is_root: bool) -> str:
    for needle, name in ROLES:
        if needle in cmd:
            return name
    return "root" if is_root else "child"


def facts(pid: int, root: int, proc_root: Path = proctree.PROC) -> dict[str, object]:
    """The process's state as JSON; fields that could not be read are None."""
    cmd = " ".join(proctree.cmdline(pid, proc_root))
    out: dict[str, object] = {"pid": pid, "role": role(cmd, pid == root), "cmdline": cmd[:400]}
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            t = p.cpu_times()
            out.update(
                ppid=p.ppid(),
                state=proctree.state(pid, proc_root),
                threads=p.num_threads(),
                rss_bytes=p.memory_info().rss,
                cpu_s=round(t.user + t.system, 3),
            )
            with contextlib.suppress(psutil.Error):
                out["fds"] = p.num_fds()
    except psutil.Error as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    letter = out.get("state")
    out["state_words"] = proctree.STATES.get(letter, letter) if isinstance(letter, str) else None
    out["frozen"] = proctree.frozen(pid, proc_root)
    out["wchan"] = _read(proc_root / str(pid) / "wchan")
    return out


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()[:200]
    except OSError:
        return None
