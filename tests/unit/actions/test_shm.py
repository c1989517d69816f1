"""Shared-memory cleanup after an engine's tree, with real processes holding real segments
in /dev/shm: only what the tree itself held is removed, once every member is gone."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine import proctree, shm
from kcops.agent.engine.supervisor import Supervisor
from tests.clock import ManualClock
from tests.unit.actions.shmprog import holder_cmd, make_segment, names, shm_dir

__all__ = ["shm_dir"]  # the fixture, used by name

pytestmark = pytest.mark.slow


def _start(cmd: list[str], **kw: object) -> subprocess.Popen[str]:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, **kw)  # type: ignore[call-overload]
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _until(cond: object, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


async def _held(sup: Supervisor, clock: ManualClock, want: set[str]) -> None:
    """Tick the supervisor until its ledger saw the tree holding ``want``."""
    deadline = time.monotonic() + 30
    while set(sup.shm.seen) != want:
        assert time.monotonic() < deadline, sup.shm.seen
        await asyncio.sleep(0.02)
        await sup.tick(clock())


def test_only_what_the_engine_tree_held_is_removed(shm_dir: Path) -> None:
    root = shm_dir
    make_segment(root, "before")  # there before the engine started
    ledger = shm.Ledger(root)
    ledger.spawning()
    # the engine maps three (fds closed) and its child holds one more (fd and mapping)
    engine = _start(
        holder_cmd(root, "engine_seg", "before", "busy", "reused", "--close", "--child", "kid"),
        start_new_session=True,
    )
    holder = None
    try:
        make_segment(root, "bystander")  # another process's: new, unused, same user
        holder = _start(holder_cmd(root, "busy"))  # someone else still maps one the engine had
        ledger.scan(proctree.group_pids(engine.pid), time.monotonic())
        assert set(ledger.seen) == {"engine_seg", "before", "busy", "reused", "kid"}
        os.killpg(engine.pid, signal.SIGKILL)
        engine.wait()
        _until(lambda: not proctree.group_pids(engine.pid), "the engine's group to be gone")
        (root / "reused").unlink()  # replaced by someone else: another file, same name
        make_segment(root, "reused")
        assert ledger.reap() == ["engine_seg", "kid"]
        assert names(root) == {"before", "busy", "bystander", "reused"}
    finally:
        for p in (engine, holder):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_a_crash_is_reaped_once_the_whole_group_is_gone(shm_dir: Path, tmp_path: Path) -> None:
    """The root dies, its child still maps a segment: the supervisor kills the leftover and
    removes both segments only after the child is gone (reaping at once would find the
    child's segment still mapped, skip it, and leak it for good)."""
    root, trigger = shm_dir, tmp_path / "exit-now"

    async def body() -> None:
        clock = ManualClock()
        cmd = holder_cmd(root, "root_seg", "--exit", "3", "--exit-when", str(trigger))
        sup = Supervisor(
            [*cmd, "--child", "leftover_seg"],
            RestartSection(backoff_initial_s=0),
            clock=clock,
            shm_root=root,
            shm_scan_s=0.0,
        )
        await sup.start()
        try:
            assert sup.proc is not None
            pgid = sup.proc.pid
            await _held(sup, clock, {"root_seg", "leftover_seg"})
            make_segment(root, "bystander")  # created during the engine's life, not by it
            trigger.touch()
            assert sup._waiter is not None
            assert await asyncio.wait_for(asyncio.shield(sup._waiter), 30) == 3
            await sup.tick(clock())  # the crash: leftovers killed, reaped once gone
            assert sup._reaper is not None
            await asyncio.wait_for(asyncio.shield(sup._reaper), 30)
            assert not proctree.group_pids(pgid)
            assert names(root) == {"bystander"} and sup.shm_removed_total == 2
            await sup.tick(clock())  # respawned only after the reap
            assert sup.pid() not in (None, pgid)
        finally:
            trigger.unlink(missing_ok=True)
            await sup.stop()

    asyncio.run(body())


def test_a_kill_after_grace_reaps_what_the_stubborn_tree_held(shm_dir: Path) -> None:
    root = shm_dir

    async def body() -> None:
        clock = ManualClock()
        cmd = holder_cmd(root, "psm_a", "--ignore-term", "--child", "psm_b")
        sup = Supervisor(
            cmd, RestartSection(grace_s=0.3), clock=clock, shm_root=root, shm_scan_s=0.0
        )
        await sup.start()
        try:
            await _held(sup, clock, {"psm_a", "psm_b"})
            make_segment(root, "bystander")
            old = sup.pid()
            out = await sup.restart("test")
            assert out["killed"] and out["after"]["pid"] not in (None, old)
            assert out["shm_removed"] == ["psm_a", "psm_b"]
            assert "bystander" in names(root)
            await _held(sup, clock, {"psm_a", "psm_b"})  # the new tree's, again
        finally:
            await sup.stop()
        # the new tree's own segments went with it at stop; the bystander stays
        assert names(root) == {"bystander"}

    asyncio.run(body())


def test_a_stopped_tree_is_killed_at_once_no_drain_and_its_segments_reaped(
    shm_dir: Path,
) -> None:
    """A stalled engine (its tree SIGSTOPped, as a stuck EngineCore) cannot drain:
    restart(drain=False) asks no drain, SIGKILLs the whole group at once, reaps."""
    from kcops.agent.engine import Engine
    from tests.unit.actions.fakeworker import FakeWorker

    root = shm_dir

    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        engine = Engine(url, "kcops", token=w.token)
        clock = ManualClock()
        cmd = holder_cmd(root, "psm_a", "--child", "psm_b")
        # A grace far longer than the test: only a kill at once can finish in time.
        sup = Supervisor(
            cmd,
            RestartSection(grace_s=600, drain_deadline_s=600),
            clock=clock,
            engine=engine,
            shm_root=root,
            shm_scan_s=0.0,
        )
        await sup.start()
        try:
            await _held(sup, clock, {"psm_a", "psm_b"})
            old = sup.pid()
            assert old is not None
            members = proctree.group_pids(old)
            os.killpg(old, signal.SIGSTOP)
            out = await sup.restart("stalled", drain=False)
            assert out["killed"] and out["drain"] is None
            assert "SIGKILL at once, no drain" in str(out["detail"])
            assert not any(c[1] == "/admin/drain" for c in w.calls)
            assert out["shm_removed"] == ["psm_a", "psm_b"]
            assert all(not proctree.alive(p) for p in members)
            assert out["after"]["pid"] not in (None, old)  # type: ignore[index]
        finally:
            await sup.stop()
            await engine.aclose()
            await w.stop()

    asyncio.run(body())


async def _mp_supervisor(clock: ManualClock, out: Path) -> tuple[Supervisor, str]:
    """A supervisor running tests/unit/actions/mp_engine.py; returns it and the name of
    the semaphore the tree registered (read from the engine's first line)."""
    prog = Path(__file__).with_name("mp_engine.py")
    cmd = ["sh", "-c", f'exec "{sys.executable}" "{prog}" > "{out}"']
    sup = Supervisor(cmd, RestartSection(grace_s=600, drain_deadline_s=600), clock=clock)
    await sup.start()
    deadline = time.monotonic() + 60
    while not out.exists() or not out.read_text().startswith("ready "):
        assert time.monotonic() < deadline, "mp_engine.py did not start"
        await asyncio.sleep(0.05)
    name = out.read_text().split()[1]
    assert (Path("/dev/shm") / name).exists(), name
    return sup, name


def test_a_killed_tree_leaves_no_named_semaphore_its_resource_tracker_could_remove(
    tmp_path: Path,
) -> None:
    """vLLM's case (issue 22): a stalled tree SIGKILLed at once left /dev/shm/sem.mp-*,
    which no live process maps (so no scan can attribute it) and whose owner, Python's
    resource tracker, died in the same SIGKILL. Spared until its users are gone, the
    tracker unlinks it."""

    async def body() -> None:
        clock = ManualClock()
        sup, name = await _mp_supervisor(clock, tmp_path / "out")
        try:
            old = sup.pid()
            assert old is not None
            os.kill(old, signal.SIGSTOP)  # the engine core stuck
            out = await sup.restart("stalled", drain=False)
            assert out["killed"]
            assert not (Path("/dev/shm") / name).exists(), f"{name} left behind"
        finally:
            await sup.stop()

    asyncio.run(body())


def test_a_crashed_root_s_leftovers_are_killed_and_their_semaphore_removed(
    tmp_path: Path,
) -> None:
    """The root dies by itself (SIGKILL from outside, as the OOM killer): the supervisor
    kills what is left of its group, resource tracker last, before it respawns."""

    async def body() -> None:
        clock = ManualClock()
        sup, name = await _mp_supervisor(clock, tmp_path / "out")
        try:
            old = sup.pid()
            assert old is not None
            members = proctree.group_pids(old)
            # The root is `sh` exec'ing python: the python is the root itself.
            os.kill(old, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while any(proctree.alive(p) for p in members) or (Path("/dev/shm") / name).exists():
                assert time.monotonic() < deadline, (name, [proctree.alive(p) for p in members])
                await asyncio.sleep(0.05)
                await sup.tick(clock())
        finally:
            await sup.stop()

    asyncio.run(body())
