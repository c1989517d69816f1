"""The supervisor with real child processes (tiny Python programs)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from kcops.agent.config.actions import RestartSection
from kcops.agent.engine.supervisor import Supervisor
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store
from tests.clock import ManualClock
from tests.unit.actions.fakeworker import FakeWorker

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(60)",
]
CRASHER = [sys.executable, "-c", "import sys; sys.exit(3)"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def wait_exit(sup: Supervisor) -> None:
    assert sup._waiter is not None
    await asyncio.wait_for(asyncio.shield(sup._waiter), 10)


def test_graceful_restart_drains_then_respawns() -> None:
    async def body() -> None:
        from kcops.agent.engine import Engine

        w = FakeWorker()
        url = await w.start()
        engine = Engine(url, "kcops", token=w.token)
        store = Store()
        clock = ManualClock()
        sup = Supervisor(
            SLEEPER, RestartSection(grace_s=2), clock=clock, store=store, engine=engine
        )
        await sup.start()
        try:
            old = sup.pid()
            assert old is not None
            out = await sup.restart("test")
            assert out["before"] == {"pid": old} and out["after"]["pid"] not in (None, old)
            assert not out["killed"] and out["drain"] == {
                "how": "drain",
                "engine_drain_s": 0,
                "drained": True,
                "in_flight_left": 0,
            }
            assert ("POST", "/admin/drain", {"admit": False}) in w.calls
            assert not alive(old)
            await sup.tick(clock())
            key = SeriesKey.of("kcops_engine_restarts_total")
            assert store.latest(key) == (clock(), 1.0)
        finally:
            await sup.stop()
            await engine.aclose()
            await w.stop()
        assert sup.pid() is None

    asyncio.run(body())


async def _until_ignores_sigterm(pid: int, timeout_s: float = 30.0) -> None:
    """Wait on the condition itself: SIGTERM (bit 14) set in the child's SigIgn mask."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        mask = int(
            next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16
        )
        if mask & (1 << (signal.SIGTERM - 1)):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"pid {pid} did not ignore SIGTERM within {timeout_s}s")


def test_sigkill_after_grace() -> None:
    async def body() -> None:
        sup = Supervisor(STUBBORN, RestartSection(grace_s=0.5), clock=ManualClock())
        await sup.start()
        try:
            old = sup.pid()
            assert old is not None
            await _until_ignores_sigterm(old)
            out = await sup.restart()
            assert out["killed"] and out["after"]["pid"] != old
        finally:
            await sup.stop()

    asyncio.run(body())


def test_crash_backoff_then_crash_loop_pages() -> None:
    async def body() -> None:
        pages: list[dict[str, Any]] = []
        clock = ManualClock()
        cfg = RestartSection(backoff_initial_s=1, backoff_max_s=4, crash_loop_max=4)
        sup = Supervisor(
            CRASHER,
            cfg,
            clock=clock,
            page=lambda message, **kw: pages.append({"message": message, **kw}),
        )
        await sup.start()
        delays = []
        for _ in range(3):
            await wait_exit(sup)
            await sup.tick(clock())
            assert sup.respawn_at is not None
            delays.append(sup.respawn_at - clock())
            await sup.tick(clock.advance(delays[-1] - 0.01))
            assert sup.pid() is None or sup.proc.returncode is not None  # type: ignore[union-attr]
            await sup.tick(clock.advance(0.01))  # respawned now
        assert delays == [1.0, 2.0, 4.0]
        await wait_exit(sup)
        await sup.tick(clock())
        assert sup.gave_up and len(pages) == 1 and "crash loop" in pages[0]["message"]
        assert sup.restarts == 3 and not sup.status()["healthy"]
        await sup.stop()

    asyncio.run(body())


def test_not_restarted_while_starting() -> None:
    """An engine that has not been healthy since its start is loading, not hung."""

    async def body() -> None:
        from kcops.agent.actions.base import Check, NoParams
        from kcops.agent.actions.restart_worker import SPEC
        from kcops.agent.config import parse_config
        from kcops.agent.engine import Engine
        from kcops.agent.outcome import ActionRejected
        from kcops.agent.samples import Sample

        store = Store()
        clock = ManualClock()
        cfg = parse_config({"actions": {"restart": {"startup_grace_s": 60}}})
        sup = Supervisor(SLEEPER, cfg.actions.restart, clock=clock, store=store)
        await sup.start()
        engine = Engine(None)
        params = NoParams()

        def check() -> None:
            assert SPEC.precheck is not None
            SPEC.precheck(Check(cfg, engine, sup, clock()), params)

        try:
            import pytest

            with pytest.raises(ActionRejected) as exc:
                check()
            assert exc.value.reason == "starting"
            # healthy once since the start: restarts are allowed
            store.add([Sample.of("kcops_engine_up", 1)], clock.advance(5))
            await sup.tick(clock())
            check()
            # after a restart it is starting again, until healthy or the grace passes
            await sup.restart()
            clock.advance(1)
            with pytest.raises(ActionRejected):
                check()
            clock.advance(60)
            check()
        finally:
            await sup.stop()

    asyncio.run(body())
