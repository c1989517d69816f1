"""Capabilities per engine: refusals before guards, vLLM's answers read, never widened.

vLLM's answers come from a real HTTP server replaying vLLM 0.32's shapes
(tests/unit/actions/fakevllm.py); tests/engines/vllm covers it for real.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from kcops.agent.events import Step
from kcops.agent.outcome import ActionName
from tests.clock import ManualClock
from tests.unit.actions.fakevllm import FakeVllm
from tests.unit.actions.harness import audit, make_ctx, make_rem, settle, transition


def vllm_ctx(tmp_path: Path, url: str, clock: ManualClock, **actions: object):  # type: ignore[no-untyped-def]
    ctx, spans = make_ctx(tmp_path, url, clock, **actions)
    ctx.config.engine.adapter = "vllm"
    return ctx, spans


def test_vllm_refuses_route_and_lru_before_guards_and_reads_success_false(tmp_path: Path) -> None:
    async def body() -> None:
        v = FakeVllm(dev_mode=True)
        url = await v.start()
        clock = ManualClock()
        ctx, _ = vllm_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        try:
            await rem.engine.resolve()
            r = rem.runner.submit("fallback_to_base")
            assert (r.outcome, r.refusal, r.error) == (
                "refused",
                "unsupported",
                "vllm has no route control",
            )
            r = rem.runner.submit("evict_cache", {"policy": "lru", "fraction": 0.5})
            assert r.outcome == "refused" and "cannot evict with policy 'lru'" in (r.error or "")
            assert v.calls == []  # never widened into a full reset
            assert rem.guards.runs == [] and rem.guards.cooldown_until == {}
            v.busy = True
            r = rem.runner.submit("evict_cache", {"policy": "all"})
            await r.task  # type: ignore[misc]
            assert r.outcome == "failed" and "success=false" in (r.error or "")
            v.busy = False
            r = rem.runner.submit("evict_cache", {"policy": "all"}, force=True, reason="idle now")
            await r.task  # type: ignore[misc]
            assert r.outcome == "ok", r.error
            assert v.calls[-1][2] == {"reset_running_requests": "false"}
        finally:
            await rem.stop()
            await v.stop()
        recs = audit(rem, "action")
        assert [(x["outcome"], x["refusal"]) for x in recs] == [
            ("refused", "unsupported"),
            ("refused", "unsupported"),
            ("failed", None),
            ("ok", None),
        ]

    asyncio.run(body())


def test_a_ladder_moves_past_a_step_vllm_cannot_do_without_spending(tmp_path: Path) -> None:
    async def body() -> None:
        v = FakeVllm(dev_mode=True)
        url = await v.start()
        clock = ManualClock()
        ctx, _ = vllm_ctx(tmp_path, url, clock, mode="enforce")
        rem = await make_rem(ctx)
        steps = (
            Step(ActionName.FALLBACK_TO_BASE, {}, 30.0),
            Step(ActionName.EVICT_CACHE, {"policy": "all"}, 30.0),
        )
        try:
            await rem.engine.resolve()
            ctx.bus.publish(transition("KcopsDeviceMemoryHigh", "firing", clock(), steps))
            await settle(rem)
            await rem.tick(clock.advance(1))
        finally:
            await rem.stop()
            await v.stop()
        runs = audit(rem, "action")
        assert [(r["action"], r["outcome"]) for r in runs] == [
            ("fallback_to_base", "refused"),
            ("evict_cache", "ok"),
        ]
        skipped = [r for r in audit(rem, "ladder") if r["event"] == "skipped"]
        assert len(skipped) == 1 and "vllm has no route control" in skipped[0]["why"]
        assert not any(k.startswith("fallback_to_base") for k in rem.guards.cooldown_until)
        assert [a for _, a in rem.guards.runs] == ["evict_cache"]

    asyncio.run(body())


def test_ticket_alert_with_nothing_applicable_is_not_a_page(tmp_path: Path) -> None:
    async def body() -> None:
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, None, clock, mode="enforce")
        rem = await make_rem(ctx)
        steps = (Step(ActionName.NOTIFY, {"severity": "ticket"}, 30.0),)
        try:
            ev = transition(
                "KcopsPrefixCacheHitRateLow",
                "firing",
                clock(),
                steps,
                labels={"severity": "ticket"},
            )
            ctx.bus.publish(ev)
            await rem.tick(clock.advance(1))
        finally:
            await rem.stop()
        assert audit(rem, "page") == [] and rem.pager.pages == 0
        esc = audit(rem, "escalation")
        assert len(esc) == 1 and esc[0]["severity"] == "ticket"
        assert "no applicable remediation" in esc[0]["message"]
        assert "actions.notify.url is not configured" in esc[0]["message"]

    asyncio.run(body())


def test_vllm_pause_only_in_dev_mode_probed_once() -> None:
    from kcops.agent.engine import Engine

    async def body() -> None:
        for dev in (True, False):
            v = FakeVllm(dev_mode=dev)
            url = await v.start()
            eng = Engine(url, "auto")
            try:
                assert await eng.resolve() == "vllm"
                caps = eng.capabilities
                assert caps is not None and caps.pause is dev and not caps.route
                how = await eng.stop_admitting(deadline_s=5)
                assert how == ("pause" if dev else None)
                await eng.resume_admitting(how)
                paths = [c[1] for c in v.calls]
                assert paths == (["/pause", "/resume"] if dev else [])
            finally:
                await eng.aclose()
                await v.stop()

    asyncio.run(body())


def test_check_config_warns_about_steps_that_will_refuse(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kcops.cli.agent_cmd import agent_group

    cfg = tmp_path / "agent.yaml"
    cfg.write_text("actions: {scale: {hpa: serving}}\n")
    res = CliRunner().invoke(agent_group, ["check-config", str(cfg)])
    assert res.exit_code == 0
    assert "warning: actions.notify.url is not set: notify steps are refused" in res.output
    assert "scale_out steps are refused" not in res.output
