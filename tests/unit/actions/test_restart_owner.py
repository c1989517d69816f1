"""One owner of restarts: restart_worker is refused while the supervisor backs off."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine.supervisor import Supervisor
from tests.clock import ManualClock
from tests.services import wait_until_async
from tests.unit.actions.harness import audit, build_rem, make_ctx


async def _exited(sup: Supervisor, clock: ManualClock) -> None:
    async def seen() -> object:
        await sup.tick(clock.advance(0.1))
        return sup.last_exit_info

    await wait_until_async(seen, 30, "the engine's exit")


def test_restart_worker_is_refused_while_the_supervisor_backs_off(tmp_path: Path) -> None:
    async def body() -> None:
        clock = ManualClock()
        ctx, _ = make_ctx(
            tmp_path,
            None,
            clock,
            mode="enforce",
            restart={"backoff_initial_s": 100, "startup_grace_s": 0},
        )
        sup = Supervisor(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            ctx.config.actions.restart,
            clock=clock,
        )
        rem = build_rem(ctx, supervisor=sup)
        await rem.start()
        await sup.start()
        try:
            first = sup.pid()
            assert first is not None
            os.kill(first, signal.SIGKILL)  # the engine dies: the supervisor backs off
            await _exited(sup, clock)
            assert sup.backing_off() is not None
            run = rem.runner.submit("restart_worker", reason="test")
            assert run.outcome == "refused" and run.refusal == "supervisor_owns"
            assert "the supervisor respawns it in" in (run.error or "")
            assert sup.pid() is None  # nothing respawned behind the supervisor's back
            assert await rem.audit.sync()
            refused = [r for r in audit(rem, "action") if r["action"] == "restart_worker"]
            assert [r["refusal"] for r in refused] == ["supervisor_owns"]

            # the backoff over, the supervisor respawns; restart_worker is its own again
            async def respawned() -> int | None:
                await sup.tick(clock.advance(10))
                return sup.pid()

            await wait_until_async(respawned, 30, "the supervisor's respawn")
            assert sup.backing_off() is None
            again = rem.runner.submit("restart_worker", reason="test")
            assert again.refusal != "supervisor_owns"
            if again.task is not None:
                await asyncio.wait([again.task], timeout=30)
        finally:
            await sup.stop()
            await rem.stop()

    asyncio.run(body())


def test_an_engine_action_waits_while_the_supervisor_respawns(tmp_path: Path) -> None:
    """An OOM-killed engine is respawned by the supervisor; the OOM ladder's lower_topn,
    submitted at the same tick, is refused ``starting`` (the ladder retries it on the new
    engine) instead of failing on the dead one and leaving the ladder exhausted."""

    async def body() -> None:
        clock = ManualClock()
        ctx, _ = make_ctx(
            tmp_path,
            None,
            clock,
            mode="enforce",
            restart={"backoff_initial_s": 100, "startup_grace_s": 0},
        )
        rem = build_rem(ctx)
        sup = Supervisor(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            ctx.config.actions.restart,
            clock=clock,
            engine=rem.engine,
        )
        rem.supervisor = rem.runner.supervisor = sup
        await rem.start()
        await sup.start()
        try:
            rem.engine.observe(lc.Health(clock(), True))  # ready
            first = sup.pid()
            assert first is not None
            os.kill(first, signal.SIGKILL)  # the kernel's OOM kill

            async def reaped() -> bool:  # the exit known, no tick has seen it yet
                await asyncio.sleep(0.02)
                return sup.proc is not None and sup.proc.returncode is not None

            await wait_until_async(reaped, 30, "the engine's exit status")
            early = rem.runner.submit("lower_topn", reason="KcopsEngineOOM, same tick")
            assert early.refusal == "starting", early  # the OOM alert can beat the tick
            await _exited(sup, clock)
            assert rem.engine.state is lc.EngineState.DOWN and sup.respawning()
            run = rem.runner.submit("lower_topn", reason="KcopsEngineOOM")
            assert run.outcome == "skipped_starting" and run.refusal == "starting", run
            assert "respawns it in" in (run.error or "")
        finally:
            await rem.stop()
            await sup.stop()

    asyncio.run(body())
