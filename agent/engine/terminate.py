"""Stopping the engine's whole process group: SIGTERM to its root, SIGKILL after a grace.

The supervisor starts the engine in its own session, so the group id is the
root's pid (:mod:`kcops.agent.engine.proctree`). A group is gone only when no
member is alive (zombies do not count): a worker that outlives its parent
still holds memory and shared segments, so the shared memory reaper and the
respawn wait for the whole group, not only the root.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypedDict

from kcops.agent.engine import proctree

log = logging.getLogger("kcops.agent.engine.supervisor")

PR_SET_PDEATHSIG = 1
# After SIGKILL (or a crash), how long to wait for every member of the group to be
# gone before the shared memory is reaped: a dying process still maps its segments.
GONE_WAIT_S = 10.0
# Python's multiprocessing resource tracker, by its command line (``python -c 'from
# multiprocessing.resource_tracker import main;main(FD)'``), and how long it gets to
# unlink what its killed users registered before it is killed too.
TRACKER_ARGV = "from multiprocessing.resource_tracker import main"
TRACKER_WAIT_S = 3.0


class ExitInfo(TypedDict):
    """How the child died, as far as is known (an OOM verdict is the process watcher's)."""

    pid: int | None
    returncode: int
    signal: str | None
    by_supervisor: bool  # the supervisor's own SIGKILL
    t: float


def exit_info(pid: int | None, returncode: int, killed_pid: int | None, now: float) -> ExitInfo:
    """What is known, nothing guessed: a SIGKILL is a kill; OOM needs evidence (cgroup
    oom_kill, kernel log, engine log), which the process watcher reads."""
    sig = -returncode if returncode < 0 else None
    return {
        "pid": pid,
        "returncode": returncode,
        "signal": signal.Signals(sig).name if sig else None,
        "by_supervisor": pid is not None and pid == killed_pid,
        "t": now,
    }


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the agent dies, even by SIGKILL.

    The engine runs in its own session (so restarts can signal its whole
    group); without this an agent killed hard would leave it orphaned.
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def group_alive(pgid: int, proc_root: Path = proctree.PROC) -> bool:
    """True while a member of the group is alive (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(proctree.group_pids(pgid, proc_root))


async def wait_gone(pgid: int, timeout_s: float, proc_root: Path = proctree.PROC) -> bool:
    """Wait until no member of the group is alive; False at the deadline."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid, proc_root):
        if time.monotonic() >= deadline:
            log.warning("engine process group %d still alive after %.0fs", pgid, timeout_s)
            return False
        await asyncio.sleep(0.05)
    return True


async def terminate(
    pgid: int,
    waiter: asyncio.Task[int],
    grace_s: float,
    *,
    proc_root: Path = proctree.PROC,
    before_signal: Callable[[int], None] = lambda pgid: None,
    at_once: bool = False,
) -> bool:
    """SIGTERM the group's root ``pgid``, SIGKILL the whole group after ``grace_s``.
    True when SIGKILL was needed. ``waiter`` is the root's ``wait()``;
    ``before_signal(pgid)`` runs just before each signal (the shared memory scan).
    ``at_once``: SIGKILL the whole group now (a stalled or hung engine cannot drain).

    SIGTERM goes to the root only, as a container runtime sends it, so vLLM's API
    server stops its engine core, which stops its workers, in order (a worker that
    got SIGTERM itself would exit at once, before the core finished draining).
    Members still alive once the root is gone get SIGTERM then. Waits for the whole group.
    """
    if at_once:
        grace_s = 0.0
    else:
        before_signal(pgid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    await asyncio.wait([waiter], timeout=grace_s)
    if waiter.done() and group_alive(pgid, proc_root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
    while group_alive(pgid, proc_root) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if not group_alive(pgid, proc_root):
        await asyncio.wait([waiter], timeout=GONE_WAIT_S)
        return False
    before_signal(pgid)
    await kill_group(pgid, proc_root)
    await asyncio.wait([waiter], timeout=GONE_WAIT_S)
    await wait_gone(pgid, GONE_WAIT_S, proc_root)
    return True


def resource_trackers(pids: list[int], proc_root: Path = proctree.PROC) -> list[int]:
    """Those of ``pids`` that are Python's multiprocessing resource tracker."""
    return [p for p in pids if TRACKER_ARGV in " ".join(proctree.cmdline(p, proc_root))]


def kill_all_but_trackers(pgid: int, proc_root: Path = proctree.PROC) -> list[int]:
    """SIGKILL every live member of the group but its resource trackers; returns those.

    Python's ``multiprocessing.resource_tracker`` (vLLM's engine core and workers
    start one) unlinks the named semaphores and shared memory its users registered
    once the last of them is gone: spared, it cleans up what a SIGKILL left, under
    names no scan of open files can attribute (a ``sem.mp-*`` nobody maps any more).
    """
    trackers: list[int] = []
    for _ in range(3):  # again, for a member forked while the first pass ran
        pids = proctree.group_pids(pgid, proc_root)
        trackers = resource_trackers(pids, proc_root)
        rest = [p for p in pids if p not in trackers]
        if not rest:
            break
        for pid in rest:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    for pid in trackers:  # a stopped tracker (the whole tree SIGSTOPped) cannot clean up
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
    return trackers


async def kill_group(pgid: int, proc_root: Path = proctree.PROC) -> None:
    """SIGKILL the whole group, its resource trackers last: they get
    :data:`TRACKER_WAIT_S` to clean up after their users and exit by themselves."""
    trackers = kill_all_but_trackers(pgid, proc_root)
    deadline = time.monotonic() + TRACKER_WAIT_S
    while trackers and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        trackers = [p for p in trackers if proctree.alive(p, proc_root)]
    if trackers:
        log.warning("resource tracker(s) %s still alive after %.0fs: killed", trackers,
                    TRACKER_WAIT_S)  # fmt: skip
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
