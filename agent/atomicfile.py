"""Files written whole or not at all: temp file, fsync, rename, fsync of the folder.

Shared by every state file the agent keeps (the remediation state, the alerts' ``for``
state), so each gets the same durability and the same clean-up of temps a crash left.
Each writes from a :class:`Writer` of its own: one thread, so the agent's loop never
waits for a disk, and a slow disk holds back no other thread pool (collectors, reads).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class Writer:
    """One file's writer thread: jobs run one at a time, in the order they came."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"kcops-{name}")

    async def run(self, job: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, job)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=False)


def tmp_name(path: Path) -> Path:
    """This thread's temp file for ``path`` (hidden, beside it, so the rename is atomic;
    per thread, so two writers of one path in a process never share one)."""
    return path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    """``payload`` as the whole of ``path``, or (on any failure) the old file and no temp."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def remove_stale_temps(path: Path) -> int:
    """Delete temp files of ``path`` left by earlier (crashed) processes; returns how many."""
    n = 0
    with contextlib.suppress(OSError):
        for tmp in path.parent.glob(f".{path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
                n += 1
    return n
