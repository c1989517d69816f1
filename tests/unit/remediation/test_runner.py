"""The runner against a real HTTP server standing in for the worker's admin API."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kcops.agent.outcome import ActionName
from tests.clock import ManualClock
from tests.unit.actions.fakeworker import FakeWorker
from tests.unit.actions.harness import audit, counter, make_ctx, make_rem


def test_enforce_runs_audits_counts_and_traces(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        ctx, spans = make_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("evict_cache", {"policy": "lru", "fraction": 0.5})
            assert run.task is not None
            await run.task
            assert run.outcome == "ok", run.error
            assert w.state["cache"]["blocks"] == 50
            run = rem.runner.submit("fallback_to_base")
            await run.task  # type: ignore[misc]
            assert w.state["route_mode"] == "fallback"
            run = rem.runner.submit("lower_topn", {"step": 32})
            await run.task  # type: ignore[misc]
            assert w.state["top_n"] == 32
            run = rem.runner.submit("raise_topn")
            await run.task  # type: ignore[misc]
            assert w.state["top_n"] == 48  # default step 16
            await rem.tick(clock())
        finally:
            await rem.stop()
            await w.stop()
        recs = audit(rem, "action")
        assert [r["action"] for r in recs] == [
            "evict_cache",
            "fallback_to_base",
            "lower_topn",
            "raise_topn",
        ]
        ev = recs[0]
        assert ev["mode"] == "enforce" and ev["outcome"] == "ok"
        assert ev["params"] == {
            "policy": "lru",
            "fraction": 0.5,
            "engine": True,
            "redis": True,
            "drop_running": False,
        }
        assert ev["before"]["engine"]["blocks"] == 100 and ev["after"]["engine"]["blocks"] == 50
        assert recs[1]["before"] == "normal" and recs[1]["after"] == "fallback"
        assert recs[2]["before"] == {"top_n": 64} and recs[2]["after"] == {"top_n": 32}
        assert counter(ctx, "evict_cache", "ok") == 1
        names = [s.name for s in spans.get_finished_spans()]
        assert names.count("action evict_cache") == 1
        attrs = spans.get_finished_spans()[0].attributes or {}
        assert attrs["kcops.outcome"] == "ok"

    asyncio.run(body())


def test_dry_run_changes_nothing_and_logs_everything(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="dry-run")
        rem = await make_rem(ctx)
        before = w.snapshot()
        try:
            for name in ("evict_cache", "fallback_to_base"):
                run = rem.runner.submit(name)
                assert run.outcome == "dry_run" and run.task is None
            # top-N reads the engine's state first (read-only), as enforce does
            for name in ("lower_topn", "raise_topn"):
                run = rem.runner.submit(name)
                assert run.task is not None
                await run.task
                assert run.outcome == "dry_run", run.error
            # dry-run runs the same checks as enforce: no supervisor, no restart
            run = rem.runner.submit("restart_worker")
            assert run.outcome == "refused" and run.refusal == "not_configured"
            assert run.result is not None and run.result.detail.startswith(
                "dry run: would refuse: restart_worker: the agent does not supervise"
            )
            # and a per-request dry run of an enforcing agent
            ctx.config.actions.mode = "enforce"
            run = rem.runner.submit("fallback_to_base", dry_run=True, force=True, reason="t")
            assert run.outcome == "dry_run"
            await rem.tick(clock())
        finally:
            await rem.stop()
            await w.stop()
        assert w.snapshot() == before
        assert w.calls == []
        recs = audit(rem, "action")
        assert [r["outcome"] for r in recs] == ["dry_run"] * 4 + ["refused", "dry_run"]
        assert recs[4]["refusal"] == "not_configured"
        assert counter(ctx, "evict_cache", "dry_run") == 1

    asyncio.run(body())


def test_refusals_are_typed_audited_and_counted(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        w.state["top_n"] = 256  # at the engine's upper bound
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        try:
            r = rem.runner.submit("evict_cache", {"policy": "newest"})
            assert r.outcome == "invalid" and "policy" in (r.error or "")
            del rem.registry._specs[ActionName.NOTIFY]  # an action this agent does not have
            r = rem.runner.submit(ActionName.NOTIFY)
            assert r.outcome == "invalid" and r.refusal == "unknown"
            r = rem.runner.submit("evict_cache", force=True)
            assert r.outcome == "invalid" and "reason" in (r.error or "")
            r = rem.runner.submit("raise_topn")
            await r.task  # type: ignore[misc]
            assert r.outcome == "refused" and "bound" in (r.error or "")
            assert r.refusal == "at_bound"
            # a refusal spends no cooldown and no budget: asked again, it is tried again
            assert rem.guards.cooldown_until == {} and rem.guards.runs == []
            r = rem.runner.submit("raise_topn")
            await r.task  # type: ignore[misc]
            assert r.outcome == "refused"
            r = rem.runner.submit("restart_worker")  # not supervised, mode auto
            assert r.outcome == "refused" and r.task is None  # refused before any guard
            assert r.refusal == "not_configured"
            ctx.config.actions.mode = "off"
            r = rem.runner.submit("evict_cache")
            assert r.outcome == "skipped_off"
            await rem.tick(clock())
        finally:
            await rem.stop()
            await w.stop()
        assert w.state["top_n"] == 256
        assert counter(ctx, "raise_topn", "skipped_cooldown") is None
        assert counter(ctx, "raise_topn", "refused") == 2

    asyncio.run(body())


def test_timeout_and_engine_down(tmp_path: Path) -> None:
    async def body() -> None:
        clock = ManualClock()
        # Nothing listens on this port: the engine is down.
        ctx, _ = make_ctx(tmp_path, "http://127.0.0.1:9", clock, mode="enforce")
        rem = await make_rem(ctx)
        try:
            r = rem.runner.submit("fallback_to_base")
            await r.task  # type: ignore[misc]
            assert r.outcome == "failed" and "Connect" in (r.error or "")
            assert rem.guards.in_flight == {}
        finally:
            await rem.stop()

    asyncio.run(body())


def test_one_off_dry_run_spends_no_cooldown_of_an_enforcing_agent(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        try:
            asked = rem.runner.submit("fallback_to_base", dry_run=True)
            assert asked.outcome == "dry_run" and w.state["route_mode"] == "normal"
            real = rem.runner.submit("fallback_to_base")
            assert real.task is not None, real.outcome  # not skipped_cooldown
            await real.task
            assert real.outcome == "ok" and w.state["route_mode"] == "fallback"
        finally:
            await rem.stop()
            await w.stop()

    asyncio.run(body())
