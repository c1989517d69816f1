"""How a supervised restart drains, per what the engine can do, with real child processes
(tests/unit/actions/shm_holder.py) and vLLM's admin answers from a real HTTP server:

- no pause, but the engine drains by itself on SIGTERM (vLLM ``--shutdown-timeout N``):
  SIGTERM goes to the main process only, and SIGKILL waits ``grace_s + N``;
- no pause and no own drain: wait for an idle moment, up to the drain deadline;
- pause (vLLM dev mode): requests held by the pause are let in before SIGTERM when the
  engine drains by itself; a restart abandoned while draining admits again.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine import Engine
from kcops.agent.engine.supervisor import Supervisor
from kcops.agent.samples import Sample
from kcops.agent.store import Store
from tests.clock import ManualClock
from tests.unit.actions.fakevllm import FakeVllm
from tests.unit.actions.shmprog import holder_cmd

pytestmark = pytest.mark.slow


def running(store: Store, n: int, t: float = 1.0) -> None:
    """vLLM's running gauge as the scrape leaves it in the store."""
    store.add([Sample.of("kcops_requests_running", float(n), {"engine": "vllm"})], t)


def test_engine_that_drains_itself_gets_its_time_and_only_the_root_gets_sigterm(
    tmp_path: Path,
) -> None:
    log = tmp_path / "term.log"

    async def body() -> None:
        cmd = holder_cmd(tmp_path, "--term-delay", "1", "--term-log", str(log))
        cmd += ["--shutdown-timeout", "3", "--child"]
        sup = Supervisor(cmd, RestartSection(grace_s=0.3), clock=ManualClock())
        await sup.start()
        try:
            await _children_ready(sup, 2)
            out = await sup.restart("test")
            # 1 s of draining is past grace_s, within grace_s + N: no SIGKILL
            assert not out["killed"] and out["grace_s"] == 3.3
            assert out["drain"] == {"how": "sigterm", "engine_drain_s": 3, "in_flight_left": None}
            # SIGTERM reached the main process only; its child, left behind when it
            # exited, got it once orphaned (a vLLM worker that gets SIGTERM exits at
            # once, and the engine core could not finish what it drains)
            assert sorted(log.read_text().splitlines()) == [
                "child orphaned=True",
                "root orphaned=False",
            ]
        finally:
            await sup.stop()

    asyncio.run(body())


def test_without_its_own_drain_the_same_engine_is_killed_after_grace(tmp_path: Path) -> None:
    async def body() -> None:
        cmd = holder_cmd(tmp_path, "--term-delay", "1")
        sup = Supervisor(cmd, RestartSection(grace_s=0.3), clock=ManualClock())
        await sup.start()
        try:
            await _children_ready(sup, 1)
            out = await sup.restart("test")
            assert out["killed"] and out["grace_s"] == 0.3
            assert out["drain"]["how"] == "wait_idle"
        finally:
            await sup.stop()

    asyncio.run(body())


async def _children_ready(sup: Supervisor, members: int) -> None:
    """Wait until the supervised tree has ``members`` processes that installed their
    SIGTERM handler (bit 14 of SigCgt in /proc/<pid>/status)."""
    from kcops.agent.engine import proctree

    assert sup.proc is not None
    pgid = sup.proc.pid
    deadline = time.monotonic() + 30
    while True:
        pids = proctree.group_pids(pgid)
        if len(pids) == members and all(_catches_term(p) for p in pids):
            return
        assert time.monotonic() < deadline, pids
        await asyncio.sleep(0.02)


def _catches_term(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    line = next(ln for ln in status.splitlines() if ln.startswith("SigCgt:"))
    return bool(int(line.split()[1], 16) & (1 << 14))


@pytest.mark.parametrize(("busy", "drained"), [(1, False), (0, True)])
def test_no_pause_no_own_drain_waits_for_an_idle_moment(
    tmp_path: Path, busy: int, drained: bool
) -> None:
    async def body() -> None:
        v = FakeVllm(dev_mode=False)
        url = await v.start()
        engine = Engine(url, "vllm")
        store = Store()
        running(store, busy)
        cfg = RestartSection(grace_s=2, drain_deadline_s=0.3)
        sup = Supervisor(holder_cmd(tmp_path), cfg, clock=ManualClock(), store=store, engine=engine)
        await sup.start()
        try:
            await _children_ready(sup, 1)
            out = await sup.restart("test")
            assert out["drain"] == {
                "how": "wait_idle",
                "engine_drain_s": 0,
                "drained": drained,
                "in_flight_left": busy,
            }
            assert v.calls == []  # nothing to pause, nothing paused
        finally:
            await sup.stop()
            await engine.aclose()
            await v.stop()

    asyncio.run(body())


@pytest.mark.parametrize(("n", "paths"), [(2, ["/pause", "/resume"]), (0, ["/pause"])])
def test_pause_then_let_held_requests_in_when_the_engine_drains_itself(
    tmp_path: Path, n: int, paths: list[str]
) -> None:
    """vLLM queues what arrives during /pause and aborts it at SIGTERM. With its own drain
    (N > 0) the agent resumes just before SIGTERM: SIGTERM stops admitting, and what was
    queued gets N seconds to finish. Without (N = 0) it would be aborted either way."""

    async def body() -> None:
        v = FakeVllm(dev_mode=True)
        url = await v.start()
        engine = Engine(url, "vllm")
        store = Store()
        running(store, 0)
        cmd = holder_cmd(tmp_path, "--shutdown-timeout", str(n))
        sup = Supervisor(cmd, RestartSection(grace_s=2), clock=ManualClock(), store=store)
        sup.engine = engine
        await sup.start()
        try:
            await _children_ready(sup, 1)
            out = await sup.restart("test")
            assert [c[1] for c in v.calls] == paths
            assert out["drain"]["how"] == "pause" and out["drain"]["drained"] is True
            assert out["drain"].get("resumed_before_sigterm", False) is (n > 0)
            assert not out["killed"]
        finally:
            await sup.stop()
            await engine.aclose()
            await v.stop()

    asyncio.run(body())


def test_a_restart_abandoned_while_draining_admits_again(tmp_path: Path) -> None:
    async def body() -> None:
        v = FakeVllm(dev_mode=True)
        url = await v.start()
        engine = Engine(url, "vllm")
        store = Store()
        running(store, 1)  # never finishes: the drain waits its whole deadline
        cfg = RestartSection(grace_s=2, drain_deadline_s=60)
        sup = Supervisor(holder_cmd(tmp_path), cfg, clock=ManualClock(), store=store, engine=engine)
        await sup.start()
        try:
            await _children_ready(sup, 1)
            old = sup.pid()
            task = asyncio.get_running_loop().create_task(sup.restart("test"))
            deadline = time.monotonic() + 30
            while ("POST", "/pause", {"mode": "wait"}) not in v.calls:
                assert time.monotonic() < deadline and not task.done(), v.calls
                await asyncio.sleep(0.02)
            assert engine.draining == "restart (test)" and not engine.serving()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert [c[1] for c in v.calls] == ["/pause", "/resume"]
            assert engine.draining is None
            assert sup.pid() == old  # never signalled
        finally:
            await sup.stop()
            await engine.aclose()
            await v.stop()

    asyncio.run(body())


def test_engine_ready_route_says_no_while_starting_or_draining(tmp_path: Path) -> None:
    """GET /api/v1/engine/ready, for a load balancer or readinessProbe: 200 only while the
    engine is ready by its health checks and no restart is draining it."""
    import httpx

    from kcops.agent.engine import lifecycle as lc
    from tests.unit.actions.fakeworker import FakeWorker
    from tests.unit.actions.harness import make_ctx, make_rem
    from tests.unit.remediation.test_routes import serve

    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        ctx, _ = make_ctx(tmp_path, url, ManualClock(), mode="enforce")
        rem = await make_rem(ctx)
        runner, base = await serve(rem)
        try:
            async with httpx.AsyncClient(base_url=base) as http:

                async def ask() -> tuple[int, dict[str, object]]:
                    r = await http.get("/api/v1/engine/ready")
                    return r.status_code, r.json()

                assert await ask() == (
                    503,
                    {
                        "serving": False, "state": "starting", "draining": None,
                        "error": "not serving (engine starting)",
                    },
                )  # fmt: skip
                rem.engine.observe(lc.Health(1.0, True))
                assert await ask() == (200, {"serving": True, "state": "ready", "draining": None})
                rem.engine.draining = "restart (test)"
                code, got = await ask()
                assert code == 503 and got["draining"] == "restart (test)"
                assert got["error"] == "not serving (draining: restart (test))"
                rem.engine.draining = None
                rem.engine.observe(lc.Health(2.0, False, "connect"))
                assert (await ask())[1]["state"] == "down"
        finally:
            await runner.cleanup()
            await rem.stop()
            await w.stop()

    asyncio.run(body())
