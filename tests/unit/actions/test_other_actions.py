"""scale_out and restart_worker against a stand-in Kubernetes API (a real HTTP
server), restart_worker by signal, notify and pages to a real webhook."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiohttp import web

from kcops.agent.outcome import ActionName
from tests.clock import ManualClock
from tests.unit.actions.harness import audit, counter, make_ctx, make_rem, settle, transition


class Recorder:
    """A real HTTP server recording requests; answers from a small routing table."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.replicas = 2
        self._runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json() if request.can_read_body else None
        self.requests.append((request.method, request.path, dict(request.headers), body))
        if request.path.endswith("/scale"):
            if request.method == "PATCH" and isinstance(body, dict):
                self.replicas = body["spec"]["replicas"]
            return web.json_response({"spec": {"replicas": self.replicas}})
        return web.json_response({"ok": True})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()


def kube_cfg(url: str, tmp: Path) -> dict[str, Any]:
    token = tmp / "sa-token"
    token.write_text("sa-secret\n")
    return {
        "api_url": url,
        "token_file": str(token),
        "ca_file": None,
        "namespace": "serving",
        "pod_name": "llm-0",
    }


def test_scale_out_patches_the_deployment_and_publishes_the_gauge(tmp_path: Path) -> None:
    async def body() -> None:
        k = Recorder()
        url = await k.start()
        clock = ManualClock()
        ctx, _ = make_ctx(
            tmp_path / "s",
            None,
            clock,
            mode="enforce",
            scale={"deployment": "llm", "max_replicas": 3},
            kubernetes=kube_cfg(url, tmp_path),
        )
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("scale_out")
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok", run.error
            assert run.result and run.result.after == {"replicas": 3}
            run = rem.runner.submit("scale_out", force=True, reason="test")
            await run.task  # type: ignore[misc]
            assert run.outcome == "refused"  # at max_replicas
            await rem.tick(clock())
        finally:
            await rem.stop()
            await k.stop()
        patch = [r for r in k.requests if r[0] == "PATCH"]
        assert len(patch) == 1
        _, path, headers, sent = patch[0]
        assert path == "/apis/apps/v1/namespaces/serving/deployments/llm/scale"
        assert headers["Authorization"] == "Bearer sa-secret"
        assert headers["Content-Type"] == "application/merge-patch+json"
        assert sent == {"spec": {"replicas": 3}}
        from kcops.agent.samples import SeriesKey

        assert ctx.store.latest(SeriesKey.of("kcops_desired_replicas"))[1] == 3  # type: ignore[index]

    asyncio.run(body())


def test_restart_worker_evicts_the_own_pod(tmp_path: Path) -> None:
    async def body() -> None:
        k = Recorder()
        url = await k.start()
        ctx, _ = make_ctx(
            tmp_path / "s",
            None,
            ManualClock(),
            mode="enforce",
            restart={"mode": "kubernetes"},
            kubernetes=kube_cfg(url, tmp_path),
        )
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("restart_worker")
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok", run.error
        finally:
            await rem.stop()
            await k.stop()
        # the Eviction API (it honours the PodDisruptionBudget), never a plain DELETE
        assert [(r[0], r[1]) for r in k.requests] == [
            ("POST", "/api/v1/namespaces/serving/pods/llm-0/eviction")
        ]

    asyncio.run(body())


def test_restart_worker_by_signal(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    async def body() -> None:
        ctx, _ = make_ctx(
            tmp_path, None, ManualClock(), mode="enforce", restart={"mode": "signal", "grace_s": 5}
        )
        ctx.config.engine.pid = child.pid
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("restart_worker")
            reaper = asyncio.get_running_loop().run_in_executor(None, child.wait)
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok", run.error
            assert await reaper == -15
        finally:
            await rem.stop()

    try:
        asyncio.run(body())
    finally:
        if child.poll() is None:
            child.kill()


def test_notify_and_pages_reach_the_webhook(tmp_path: Path) -> None:
    async def body() -> None:
        hook = Recorder()
        url = await hook.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, None, clock, mode="enforce", notify={"url": url + "/hook"})
        rem = await make_rem(ctx)
        from kcops.agent.events import Step

        try:
            run = rem.runner.submit("notify", {"message": "hello", "severity": "ticket"})
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok"
            # a one-step ladder that cannot help: the end of the ladder pages
            steps = (Step(ActionName.NOTIFY, {"message": "step"}, 5.0),)
            ctx.bus.publish(transition("KcopsLatencyFluctuation", "firing", clock(), steps))
            await settle(rem)
            await rem.tick(clock.advance(1))  # the step's notice ran: its window starts
            await rem.tick(clock.advance(6))
            if rem.pager.tasks:  # wait for the page's webhook call itself, not a clock
                await asyncio.wait(list(rem.pager.tasks), timeout=30)
            await rem.tick(clock())
        finally:
            await rem.stop()
            await hook.stop()
        bodies = [r[3] for r in hook.requests]
        assert bodies[0]["message"] == "hello" and bodies[0]["severity"] == "ticket"
        pages = [b for b in bodies if b["severity"] == "page"]
        assert len(pages) == 1 and "KcopsLatencyFluctuation" in pages[0]["message"]
        assert counter(ctx, "page", "sent") == 1
        assert len(audit(rem, "page")) == 1

    asyncio.run(body())


def test_a_notice_is_held_back_by_its_own_alerts_cooldown_only(tmp_path: Path) -> None:
    """Two alerts firing within the notify cooldown each get their notice (the drill run
    of 2026-12-02 lost one: a notice for another alert 25 s before held it back); the same
    alert's next incident within the cooldown is held back, and the budget counts all."""

    async def body() -> None:
        from kcops.agent.events import Step

        hook = Recorder()
        url = await hook.start()
        clock = ManualClock()
        guards = {"cooldown_s": 300, "action_budget_overrides": {"notify": 3}}
        ctx, _ = make_ctx(
            tmp_path, None, clock, mode="enforce", guards=guards, notify={"url": url + "/hook"}
        )
        rem = await make_rem(ctx)
        steps = (Step(ActionName.NOTIFY, {"message": "look"}, 5.0),)
        try:
            for name in ("KcopsPrefixCacheHitRateLow", "KcopsInterTokenLatencyHigh"):
                ctx.bus.publish(transition(name, "firing", clock(), steps))
                await settle(rem)
                await rem.tick(clock.advance(10))
            # the first alert resolves and fires again, well within its notice's cooldown
            for state in ("inactive", "firing"):
                ctx.bus.publish(transition("KcopsPrefixCacheHitRateLow", state, clock(), steps))
                await settle(rem)
            await rem.tick(clock.advance(1))
            run = rem.runner.submit("notify", {"message": "by hand"})  # not any alert's
            await run.task  # type: ignore[misc]
            assert run.outcome == "ok"
            ctx.bus.publish(transition("KcopsSegmentTransferSlow", "firing", clock(), steps))
            await settle(rem)
        finally:
            await rem.stop()
            await hook.stop()
        runs = [r for r in audit(rem, "action") if r["action"] == "notify"]
        by_alert = [((r.get("trigger") or {}).get("alertname"), r["outcome"]) for r in runs]
        assert by_alert[:3] == [
            ("KcopsPrefixCacheHitRateLow", "ok"),
            ("KcopsInterTokenLatencyHigh", "ok"),
            ("KcopsPrefixCacheHitRateLow", "skipped_cooldown"),
        ], by_alert
        assert [r["target"] for r in runs[:2]] == [
            "notify:KcopsPrefixCacheHitRateLow",
            "notify:KcopsInterTokenLatencyHigh",
        ]
        assert len([b for b in (r[3] for r in hook.requests) if b["message"] == "look"]) == 2
        # three notices ran (two alerts', one by hand): a third alert finds the hour's
        # budget of 3 spent
        assert by_alert[3:] == [(None, "ok"), ("KcopsSegmentTransferSlow", "skipped_budget")]

    asyncio.run(body())
