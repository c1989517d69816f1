"""Ladders, verification, restore, flapping, resume after restart — on a manual clock."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kcops.agent.events import Step
from kcops.agent.outcome import ActionName
from tests.clock import ManualClock
from tests.unit.actions.fakeworker import FakeWorker
from tests.unit.actions.harness import (
    audit,
    counter,
    make_ctx,
    make_rem,
    settle,
    transition,
)

MEM = (
    Step(ActionName.EVICT_CACHE, {"policy": "expired"}, 30.0),
    Step(ActionName.EVICT_CACHE, {"policy": "lru", "fraction": 0.5}, 30.0),
    Step(ActionName.LOWER_TOPN, {}, 30.0),
)
GUARDS = {"cooldown_s": 300}


def test_ladder_climbs_until_resolved(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce", guards=GUARDS)
        rem = await make_rem(ctx)
        try:
            ctx.bus.publish(transition("KcopsDeviceMemoryHigh", "firing", clock(), MEM))
            await settle(rem)
            assert w.state["cache"]["blocks"] == 70  # expired evicted at once
            # The run's outcome reached the ladder as the run ended: its window is open.
            lad = rem.driver.ladders["KcopsDeviceMemoryHigh"]
            assert lad.phase == "verify" and lad.step == 0 and lad.verify_until == clock() + 30
            await rem.tick(clock.advance(1))
            await rem.tick(clock.advance(28))
            assert rem.driver.ladders["KcopsDeviceMemoryHigh"].step == 0  # window not over
            await rem.tick(clock.advance(1))  # 30 s after the run ended: climb, run step 2
            await settle(rem)
            assert w.state["cache"]["blocks"] == 35
            lad = rem.driver.ladders["KcopsDeviceMemoryHigh"]
            assert lad.step == 1 and lad.phase == "verify"  # no tick needed to get here
            ctx.bus.publish(transition("KcopsDeviceMemoryHigh", "inactive", clock()))
            assert "KcopsDeviceMemoryHigh" not in rem.driver.ladders
            await rem.tick(clock.advance(100))
        finally:
            await rem.stop()
            await w.stop()
        assert w.state["top_n"] == 64  # step 3 never ran
        events = [r["event"] for r in audit(rem, "ladder")]
        assert events == ["started", "climb", "resolved"]
        runs = audit(rem, "action")
        assert [r["params"].get("policy") for r in runs] == ["expired", "lru"]
        assert runs[0]["trigger"]["alertname"] == "KcopsDeviceMemoryHigh"
        assert runs[1]["ladder"]["step"] == 1 and runs[1]["ladder"]["of"] == 3
        assert runs[1]["ladder"]["alertname"] == "KcopsDeviceMemoryHigh"
        assert counter(ctx, "evict_cache", "ok") == 2

    asyncio.run(body())


def test_failed_step_climbs_at_once_and_end_of_ladder_pages(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        w.state["top_n"] = 256  # raise_topn will be refused: at the bound
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        steps = (
            Step(ActionName.RAISE_TOPN, {}, 10.0),
            Step(ActionName.FALLBACK_TO_BASE, {}, 10.0),
        )
        try:
            ctx.bus.publish(transition("KcopsAccuracyDrop", "firing", clock(), steps))
            await settle(rem)
            await rem.tick(clock.advance(1))
            await settle(rem)
            await rem.tick(clock.advance(1))
            assert w.state["route_mode"] == "fallback"
            await rem.tick(clock.advance(10))
            lad = rem.driver.ladders["KcopsAccuracyDrop"]
            assert lad.phase == "exhausted"
            await rem.tick(clock.advance(100))
        finally:
            await rem.stop()
            await w.stop()
        pages = audit(rem, "page")
        assert len(pages) == 1 and "KcopsAccuracyDrop" in pages[0]["message"]
        assert counter(ctx, "page", "logged") == 1

    asyncio.run(body())


def test_fallback_restored_after_hold_and_audited(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce", fallback={"hold_s": 60})
        rem = await make_rem(ctx)
        steps = (Step(ActionName.FALLBACK_TO_BASE, {}, 30.0),)
        try:
            ctx.bus.publish(transition("KcopsAttentionErrors", "firing", clock(), steps))
            await settle(rem)
            assert w.state["route_mode"] == "fallback"
            await rem.tick(clock.advance(5))
            ctx.bus.publish(transition("KcopsAttentionErrors", "inactive", clock()))
            await rem.tick(clock.advance(1))  # resolved since now
            await rem.tick(clock.advance(30))
            # it fires again inside the hold: the hold starts over
            ctx.bus.publish(transition("KcopsAttentionErrors", "firing", clock(), steps))
            await rem.tick(clock.advance(1))
            ctx.bus.publish(transition("KcopsAttentionErrors", "inactive", clock()))
            await rem.tick(clock.advance(1))
            await rem.tick(clock.advance(59))
            assert w.state["route_mode"] == "fallback"
            await rem.tick(clock.advance(1))
            await settle(rem)
            assert w.state["route_mode"] == "normal"
        finally:
            await rem.stop()
            await w.stop()
        runs = audit(rem, "action")
        restore = [r for r in runs if r["action"] == "restore_route"]
        assert len(restore) == 1 and restore[0]["outcome"] == "ok"
        assert restore[0]["forced"] and "resolved for 60s" in restore[0]["reason"]
        # the second firing inside the cooldown did not run fallback again
        assert [r["outcome"] for r in runs if r["action"] == "fallback_to_base"] == [
            "ok",
            "skipped_cooldown",
        ]

    asyncio.run(body())


def test_flapping_runs_no_more_than_the_budget(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(
            tmp_path,
            url,
            clock,
            mode="enforce",
            guards={"cooldown_s": 0, "budget_per_hour": 5, "action_budget_per_hour": 100},
        )
        rem = await make_rem(ctx)
        steps = (Step(ActionName.EVICT_CACHE, {"policy": "lru", "fraction": 0.01}, 0.0),)
        try:
            for i in range(1000):  # 1,000 flaps within a minute
                ctx.bus.publish(transition("KcopsOOM", "firing", clock(), steps))
                await settle(rem)
                ctx.bus.publish(transition("KcopsOOM", "inactive", clock()))
                clock.advance(0.06)
                if i % 10 == 0:
                    await rem.tick(clock())
            await rem.tick(clock())
        finally:
            await rem.stop()
            await w.stop()
        evictions = [c for c in w.calls if c[1] == "/admin/cache/evict"]
        assert len(evictions) == 5
        assert counter(ctx, "evict_cache", "ok") == 5
        assert counter(ctx, "evict_cache", "skipped_budget") == 995
        assert len(audit(rem, "page")) == 1  # the breaker opened once, paged once

    asyncio.run(body())


def test_restart_mid_ladder_resumes_without_repeating(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        steps = (
            Step(ActionName.FALLBACK_TO_BASE, {}, 30.0),
            Step(ActionName.LOWER_TOPN, {}, 30.0),
        )
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        ctx.bus.publish(transition("KcopsOOM", "firing", clock(), steps))
        await settle(rem)
        await rem.tick(clock.advance(1))
        assert rem.driver.ladders["KcopsOOM"].phase == "verify"
        assert await rem.persist.durable()  # (its state saved, off the loop, soon after)
        # the agent dies without a clean stop: only what is on disk survives
        rem.audit.close()
        w.calls.clear()

        clock.advance(5)
        ctx2, _ = make_ctx(tmp_path, url, clock, mode="enforce")
        rem2 = await make_rem(ctx2)
        try:
            lad = rem2.driver.ladders["KcopsOOM"]
            assert lad.step == 0 and lad.phase == "verify"
            # the rule engine of the new agent sees the alert firing again
            ctx2.bus.publish(transition("KcopsOOM", "firing", clock(), steps))
            await settle(rem2)
            assert w.calls == []  # step 1 not repeated
            # a manual run inside the persisted cooldown is refused too
            assert rem2.runner.submit("fallback_to_base").outcome == "skipped_cooldown"
            await rem2.tick(clock.advance(25))  # 31 s after step 1: climb
            await settle(rem2)
            assert [c[1] for c in w.calls] == ["/admin/attention"]
            assert w.state["top_n"] == 48
        finally:
            await rem2.stop()
            await w.stop()
        assert [r["event"] for r in audit(rem2, "ladder")] == ["started", "resumed", "climb"]

    asyncio.run(body())


def test_dry_run_agent_walks_the_ladder_and_changes_nothing(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        before = w.snapshot()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock)  # default mode: dry-run
        rem = await make_rem(ctx)
        try:
            ctx.bus.publish(transition("KcopsDeviceMemoryHigh", "firing", clock(), MEM))
            for _ in range(100):
                await rem.tick(clock.advance(1))
                await settle(rem)  # lower_topn's dry run looks at the engine first (a task)
        finally:
            await rem.stop()
            await w.stop()
        assert w.snapshot() == before and w.calls == []
        runs = audit(rem, "action")
        assert [r["action"] for r in runs] == ["evict_cache", "evict_cache", "lower_topn"]
        assert {r["outcome"] for r in runs} == {"dry_run"}
        assert len(audit(rem, "page")) == 1

    asyncio.run(body())


def test_resumed_ladder_waits_for_the_new_rule_engine(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        steps = (Step(ActionName.FALLBACK_TO_BASE, {}, 30.0), Step(ActionName.LOWER_TOPN))
        grace = {"resume_grace_s": 100}
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce", guards=grace)
        rem = await make_rem(ctx)
        ctx.bus.publish(transition("KcopsOOM", "firing", clock(), steps))
        await settle(rem)
        await rem.tick(clock.advance(1))
        rem.audit.close()  # dies

        ctx2, _ = make_ctx(tmp_path, url, clock, mode="enforce", guards=grace)
        rem2 = await make_rem(ctx2)  # a fresh rule engine: nothing active yet
        try:
            for _ in range(40):  # past the verify window, inside the grace: hold
                await rem2.tick(clock.advance(1))
            lad = rem2.driver.ladders["KcopsOOM"]
            assert lad.step == 0 and w.state["top_n"] == 64
            # the condition holds again: the new rule engine says so (pending is enough)
            ctx2.bus.publish(transition("KcopsOOM", "pending", clock(), steps))
            await rem2.tick(clock.advance(1))
            await settle(rem2)
            assert rem2.driver.ladders["KcopsOOM"].unconfirmed_until is None
            assert w.state["top_n"] == 48  # verify window long over: climbed at once
        finally:
            await rem2.stop()

        # and when the alert does not come back, the ladder resolves after the grace
        ctx3, _ = make_ctx(tmp_path, url, clock, mode="enforce", guards=grace)
        rem3 = await make_rem(ctx3)
        try:
            await rem3.tick(clock.advance(99))
            assert "KcopsOOM" in rem3.driver.ladders
            await rem3.tick(clock.advance(2))
            assert "KcopsOOM" not in rem3.driver.ladders
        finally:
            await rem3.stop()
            await w.stop()

    asyncio.run(body())


def test_an_inhibited_alert_is_recorded_and_neither_laddered_nor_paged_until_released(
    tmp_path: Path,
) -> None:
    """KcopsEngineDown while the agent's own restart runs (inhibited_by set by the rules'
    inhibitor): one audit record, no ladder, no page; published again not inhibited (the
    restart over, the engine still down), it is an incident: its ladder starts."""
    from dataclasses import replace as dc_replace

    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        steps = (Step(ActionName.NOTIFY, {"message": "down"}, 30.0),)
        try:
            down = transition("KcopsEngineDown", "firing", clock(), steps)
            ctx.bus.publish(dc_replace(down, inhibited_by="KcopsEngineRestarting"))
            await settle(rem)
            await rem.tick(clock.advance(1))
            assert "KcopsEngineDown" not in rem.driver.ladders and rem.pager.pages == 0
            (rec,) = [r for r in audit(rem, "alert") if r["event"] == "inhibited"]
            assert "inhibited by KcopsEngineRestarting" in rec["detail"]
            released = dc_replace(down, previous="firing", t=clock(), inhibited_by=None)
            ctx.bus.publish(released)
            await settle(rem)
            assert "KcopsEngineDown" in rem.driver.ladders
        finally:
            await rem.stop()
            await w.stop()

    asyncio.run(body())
