"""Issue 22's escalation: a supervised engine that crash-loops pages; with
``actions.restart.crash_loop: evict_pod`` the agent also evicts its own pod (the
Eviction API of a stand-in Kubernetes API server), as an audited run."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from kcops.agent.actions.registry import builtin_actions
from kcops.agent.config import parse_config
from kcops.agent.engine import Engine
from kcops.agent.engine.supervisor import Supervisor
from kcops.agent.remediation import build
from kcops.agent.remediation.remediation import Remediation
from tests.clock import ManualClock
from tests.services import wait_until_async
from tests.unit.actions.harness import audit, ladders, make_ctx
from tests.unit.actions.test_other_actions import Recorder, kube_cfg


@pytest.mark.parametrize("policy", ["page", "evict_pod"])
def test_a_crash_loop_pages_and_evicts_the_pod_when_configured(tmp_path: Path, policy: str) -> None:
    async def body() -> None:
        k = Recorder()
        url = await k.start()
        clock = ManualClock()
        ctx, _ = make_ctx(
            tmp_path / "s",
            None,
            clock,
            mode="enforce",
            restart={"crash_loop_max": 2, "backoff_initial_s": 0, "crash_loop": policy},
            kubernetes=kube_cfg(url, tmp_path),
        )
        crashing = [sys.executable, "-c", "raise SystemExit(3)"]
        ctx.config = parse_config(
            {**ctx.config.model_dump(mode="json"), "engine": {"command": crashing}}
        )
        engine = Engine(None, "auto")
        sup, rem = build(ctx, engine, None, ladders(ctx.config, builtin_actions()))
        assert isinstance(sup, Supervisor) and isinstance(rem, Remediation)
        await rem.start()
        await sup.start()

        async def gave_up() -> bool:
            await sup.tick(clock.advance(1))
            await rem.tick(clock())
            return sup.gave_up

        try:
            await wait_until_async(gave_up, 30, "the supervisor's crash-loop verdict")
            if policy == "evict_pod":
                await wait_until_async(lambda: _evicted(rem), 30, "an evict_pod run recorded")
        finally:
            await sup.stop()
            await rem.stop()
            await k.stop()
        pages = audit(rem, "page")
        assert any("crash loop" in str(p.get("message", p)) for p in pages), pages
        evictions = [(r[0], r[1]) for r in k.requests]
        if policy == "evict_pod":
            assert evictions == [("POST", "/api/v1/namespaces/serving/pods/llm-0/eviction")]
            (run,) = [r for r in audit(rem, "action") if r.get("action") == "evict_pod"]
            assert run["outcome"] == "ok" and "evicted pod serving/llm-0" in run["detail"]
        else:
            assert evictions == []

    asyncio.run(body())


async def _evicted(rem: Remediation) -> bool:
    return any(r.get("action") == "evict_pod" for r in audit(rem, "action"))
