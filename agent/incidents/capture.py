"""One capture of the engine's tree, in a thread, within a budget.

Every process's ``/proc`` facts first (cheap, never blocking), then the stacks of all of
them at once, each bounded by the time left. What the budget did not allow is listed in
``missing``; the restart never waits longer than the budget for any of it.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor, wait

from kcops.agent.incidents import procs, stacks

MAX_PROCESSES = 32


def processes(root: int | None, budget_s: float) -> tuple[list[dict[str, object]], list[str]]:
    """The facts and stacks of ``root``'s tree, and what could not be captured."""
    deadline = time.monotonic() + budget_s
    if root is None:
        return [], [
            "processes: the engine's pid is not known (no supervisor, engine.pid or engine.pidfile)"
        ]
    pids = procs.tree(root)
    missing = []
    if not pids:
        return [], [f"processes: pid {root} is gone"]
    if len(pids) > MAX_PROCESSES:
        missing.append(f"processes: {len(pids) - MAX_PROCESSES} past the first {MAX_PROCESSES}")
        pids = pids[:MAX_PROCESSES]
    found = [procs.facts(pid, root) for pid in pids]
    pool = ThreadPoolExecutor(max_workers=min(8, len(found)), thread_name_prefix="kcops-stacks")
    jobs = {pool.submit(stacks.dump, int(str(f["pid"])), deadline, _pausable(f)): f for f in found}
    done, _ = wait(jobs, timeout=max(0.0, deadline - time.monotonic()) + 0.2)
    pool.shutdown(wait=False, cancel_futures=True)
    for job, f in jobs.items():
        if job in done and job.exception() is None:
            f["stacks"] = job.result()
        else:
            f["stacks"] = {
                "tool": stacks.version(),
                "threads": [],
                "native": False,
                "error": "not read within the budget",
            }
    for f in found:
        err = f["stacks"]["error"] if isinstance(f["stacks"], dict) else None
        if err:
            missing.append(f"stacks of pid {f['pid']} ({f['role']}): {err}")
    return found, missing


def _pausable(f: dict[str, object]) -> bool:
    """ptrace can pause a running or sleeping process, not a stopped or frozen one."""
    return not f.get("frozen") and f.get("state") not in ("T", "t", "D")
