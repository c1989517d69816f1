"""An engine whose processes cannot die: a member of its group in a frozen cgroup takes no
signal, SIGKILL included (as one stuck in the kernel, or behind a hung GPU driver). The
survivors are reported with their /proc state and counted; on a CPU engine a new one
starts beside them, on a device engine none does and the supervisor escalates."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine import proctree
from kcops.agent.engine.supervisor import Supervisor
from kcops.agent.samples import Sample
from kcops.agent.store import Store
from tests.clock import ManualClock

pytestmark = pytest.mark.slow
FREEZER = Path("/sys/fs/cgroup/freezer")
# The engine: a root that forks one worker in its group, the worker printing its pid.
ENGINE = (
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    print(os.getpid(), flush=True)\n"
    "    time.sleep(600)\n"
    "    sys.exit(0)\n"
    "time.sleep(600)\n"
)


@contextlib.contextmanager
def freezer() -> Iterator[Path]:
    """A v1 freezer cgroup of this test (removed, thawed, at the end)."""
    if not (FREEZER / "freezer.state").exists() and not FREEZER.is_dir():
        pytest.skip("no cgroup v1 freezer on this machine")
    cg = FREEZER / f"kcops-test-{os.getpid()}"
    try:
        cg.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a freezer cgroup (needs root): {exc}")
    try:
        yield cg
    finally:
        with contextlib.suppress(OSError):
            (cg / "freezer.state").write_text("THAWED")
        for pid in (cg / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                os.kill(int(pid), 9)
        deadline = time.monotonic() + 10
        while (cg / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            cg.rmdir()


def freeze(cg: Path, pid: int) -> None:
    (cg / "cgroup.procs").write_text(str(pid))
    (cg / "freezer.state").write_text("FROZEN")
    deadline = time.monotonic() + 10
    while (cg / "freezer.state").read_text().strip() != "FROZEN":
        assert time.monotonic() < deadline, "the cgroup did not freeze"
        time.sleep(0.02)


async def _worker_pid(sup: Supervisor) -> int:
    """The forked worker's pid, as the engine printed it."""
    deadline = time.monotonic() + 30
    while True:
        assert sup.proc is not None
        pids = [p for p in proctree.group_pids(sup.proc.pid) if p != sup.proc.pid]
        if pids:
            return pids[0]
        assert time.monotonic() < deadline, "the engine never forked its worker"
        await asyncio.sleep(0.05)


def _supervisor(store: Store, beside: str, pages: list[str]) -> Supervisor:
    cfg = RestartSection(grace_s=0.5, beside_survivors=beside)  # type: ignore[arg-type]
    return Supervisor(
        [sys.executable, "-c", ENGINE],
        cfg,
        clock=ManualClock(),
        store=store,
        page=lambda message, **kw: pages.append(message),
    )


def test_on_a_cpu_engine_survivors_are_reported_and_a_new_engine_starts_beside() -> None:
    async def body() -> None:
        store, pages = Store(), []
        sup = _supervisor(store, "auto", pages)
        with freezer() as cg:
            await sup.start()
            old = sup.pid()
            worker = await _worker_pid(sup)
            freeze(cg, worker)
            report = await sup.restart("test", drain=False)
            assert sup.pid() is not None and sup.pid() != old  # started beside, on a CPU
            assert sup.survivors.stuck == {old: [worker]}
            assert "uninterruptible" in proctree.describe(worker) or "cgroup frozen" in (
                proctree.describe(worker)
            )
            assert report["killed"] is True and not pages
            sup.publish(sup.clock() + 1)
            assert _stuck(store) == 1.0
            (cg / "freezer.state").write_text("THAWED")  # the kernel lets it go: it dies
            deadline = time.monotonic() + 10
            while proctree.alive(worker):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            sup.publish(sup.clock() + 2)
            assert _stuck(store) == 0.0 and sup.survivors.stuck == {}
        await sup.stop()

    asyncio.run(body())


def test_on_a_device_engine_no_second_engine_starts_and_the_failure_names_the_survivors() -> None:
    async def body() -> None:
        store, pages = Store(), []
        # the agent reads a GPU (NVML): the old engine's processes hold its memory
        store.add([Sample.of("kcops_device_memory_total_bytes", 8e10, {"device": "0"})], 0.0)
        sup = _supervisor(store, "auto", pages)
        with freezer() as cg:
            await sup.start()
            old = sup.pid()
            worker = await _worker_pid(sup)
            freeze(cg, worker)
            with pytest.raises(RuntimeError, match="outlive SIGKILL") as exc:
                await sup.restart("test", drain=False)
            assert f"{worker} (" in str(exc.value) and "cgroup frozen" in str(exc.value)
            assert sup.pid() is None  # nothing started beside them
            assert sup.backing_off() == str(exc.value)  # restart_worker is refused meanwhile
            assert pages == []  # the restart_worker that asked fails with it: its ladder pages
            await sup.tick(1e9)  # nor later, on a tick
            assert sup.pid() is None and pages == []
            assert sup.survivors.stuck == {old: [worker]}
        await sup.stop()

    asyncio.run(body())


def _stuck(store: Store) -> float | None:
    got = store.latest(next(iter(store.keys("kcops_engine_stuck_processes"))))
    return None if got is None else got[1]


def test_describe_names_a_process_state_and_command() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        while "sleeping" not in proctree.describe(p.pid):
            assert time.monotonic() < deadline, proctree.describe(p.pid)
            time.sleep(0.02)
        assert proctree.describe(p.pid).startswith(f"{p.pid} (sleeping: ")
        assert "time.sleep(30)" in proctree.describe(p.pid)
    finally:
        p.kill()
        p.wait()
