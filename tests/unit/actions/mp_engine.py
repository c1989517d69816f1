"""An engine-like process tree for the shared-memory tests: Python multiprocessing under
the spawn start method, as vLLM's engine core and workers use it.

It creates a named semaphore (``/dev/shm/sem.mp-*``, registered with the resource
tracker it starts), starts a child that holds it, prints ``ready <file name>`` and
sleeps. Killed with SIGKILL, only the resource tracker can unlink the semaphore: no
live process maps it once its users are gone.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
from typing import Any


def _child(lock: Any) -> None:
    signal.pause()  # until killed


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    lock = ctx.Lock()
    child = ctx.Process(target=_child, args=(lock,), daemon=True)
    child.start()
    print("ready sem." + lock._semlock.name.lstrip("/"), flush=True)  # type: ignore[attr-defined]
    signal.pause()  # until killed
