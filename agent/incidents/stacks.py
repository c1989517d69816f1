"""The Python stacks of one process, read from outside it by py-spy.

``py-spy dump --native`` pauses the process through ptrace for a moment and adds native
frames; a stopped or cgroup-frozen process cannot be paused that way (ptrace waits for
it), so it is read with ``--nonblocking``, which reads its memory and never waits on it.
A dump that fails or overruns its share of the budget is retried without native
frames; the time left bounds every try, and the tool is killed when it runs out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from functools import cache

MAX_THREADS = 256
MAX_FRAMES = 64


@cache
def tool() -> str | None:
    """py-spy beside the agent's interpreter (its wheel installs it there), else on PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which("py-spy", path=os.pathsep.join([here, os.environ.get("PATH", "")]))


@cache
def version() -> str:
    exe = tool()
    if exe is None:
        return "py-spy (not installed)"
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return "py-spy"
    return out.stdout.strip() or "py-spy"


def dump(pid: int, deadline: float, paused_ok: bool) -> dict[str, object]:
    """``{"tool", "native", "threads", "error"}``; ``paused_ok`` False (a stopped or frozen
    process) skips the native try."""
    exe = tool()
    out: dict[str, object] = {"tool": version(), "native": False, "threads": [], "error": None}
    if exe is None:
        out["error"] = "py-spy is not installed (pip install py-spy)"
        return out
    tries = [["--native"], ["--nonblocking"]] if paused_ok else [["--nonblocking"]]
    errors = []
    for i, extra in enumerate(tries):
        left = deadline - time.monotonic()
        if left <= 0.05:
            errors.append("budget spent")
            break
        # The native try gets half of what is left, so the plain one still has time.
        limit = left / 2 if i + 1 < len(tries) else left
        got, err = _run([exe, "dump", "--pid", str(pid), "--json", *extra], limit)
        if got is not None:
            out.update(native=extra == ["--native"], threads=got)
            errors = []
            break
        errors.append(f"{' '.join(extra)}: {err}")
    out["error"] = "; ".join(errors) or None
    return out


def _run(argv: list[str], limit: float) -> tuple[list[dict[str, object]] | None, str]:
    try:
        done = subprocess.run(argv, capture_output=True, timeout=limit, check=False)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {limit:.2f}s"
    except OSError as exc:
        return None, str(exc)
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines()
        return None, " / ".join(lines[:3])[:300] or f"exit {done.returncode}"
    try:
        raw = json.loads(done.stdout)
    except ValueError:
        return None, "py-spy printed no JSON"
    return [_thread(t) for t in raw[:MAX_THREADS] if isinstance(t, dict)], ""


def _thread(t: dict[str, object]) -> dict[str, object]:
    frames = t.get("frames") if isinstance(t.get("frames"), list) else []
    assert isinstance(frames, list)
    return {
        "thread_id": t.get("os_thread_id") or t.get("thread_id"),
        "name": t.get("thread_name"),
        "active": bool(t.get("active")),
        "owns_gil": bool(t.get("owns_gil")),
        "frames": [
            {"name": f.get("name"), "file": f.get("filename"), "line": f.get("line")}
            for f in frames[:MAX_FRAMES]
            if isinstance(f, dict)
        ],
    }
