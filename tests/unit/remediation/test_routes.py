"""The control API routes and the Alertmanager webhook, over real HTTP."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from kcops.agent.events import Step
from kcops.agent.outcome import ActionName
from kcops.agent.remediation.remediation import Remediation
from tests.clock import ManualClock
from tests.unit.actions.fakeworker import TOKEN, FakeWorker
from tests.unit.actions.harness import audit, make_ctx, make_rem, settle, transition

AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def serve(rem: Remediation) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.add_routes(rem.routes())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def am_payload(name: str, status: str, fp: str = "abc123", starts: str | None = None) -> Any:
    return {
        "version": "4",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "kcops",
        "groupLabels": {"alertname": name},
        "commonLabels": {"alertname": name},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": name, "pod": "p1", "severity": "page"},
                "annotations": {"summary": "x"},
                "startsAt": starts or "2026-11-30T13:00:00.123456789Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prom",
                "fingerprint": fp,
            }
        ],
    }


def test_manual_run_needs_token_and_obeys_guards(tmp_path: Path) -> None:
    async def body() -> None:
        w = FakeWorker()
        wurl = await w.start()
        ctx, _ = make_ctx(tmp_path, wurl, ManualClock(), mode="enforce")
        rem = await make_rem(ctx)
        runner, url = await serve(rem)
        try:
            async with httpx.AsyncClient(base_url=url) as c:
                r = await c.post("/api/v1/actions/fallback_to_base", json={})
                assert r.status_code == 401
                assert w.state["route_mode"] == "normal"
                r = await c.post("/api/v1/actions/fallback_to_base", json={}, headers=AUTH)
                assert r.status_code == 200, r.text
                assert r.json()["outcome"] == "ok" and r.json()["after"] == "fallback"
                r = await c.post("/api/v1/actions/fallback_to_base", json={}, headers=AUTH)
                assert r.status_code == 409 and r.json()["outcome"] == "skipped_cooldown"
                body = {"force": True, "reason": "on-call: INC-7"}
                r = await c.post("/api/v1/actions/fallback_to_base", json=body, headers=AUTH)
                assert r.status_code == 200 and r.json()["forced"]
                r = await c.post(
                    "/api/v1/actions/lower_topn",
                    json={"params": {"step": 8}, "dry_run": True},
                    headers=AUTH,
                )
                assert r.json()["outcome"] == "dry_run" and w.state["top_n"] == 64
                r = await c.post(
                    "/api/v1/actions/evict_cache", json={"params": {"x": 1}}, headers=AUTH
                )
                assert r.status_code == 422
                r = await c.post("/api/v1/actions/nope", json={}, headers=AUTH)
                assert r.status_code == 404
                r = await c.get("/api/v1/actions")
                assert "evict_cache" in [a["name"] for a in r.json()["actions"]]
                r = await c.get("/api/v1/actions/history")
                outcomes = [x.get("outcome") for x in r.json()["records"] if x["kind"] == "action"]
                assert outcomes[:4] == ["ok", "skipped_cooldown", "ok", "dry_run"]
                r = await c.get("/api/v1/remediation")
                assert r.json()["mode"] == "enforce"
        finally:
            await runner.cleanup()
            await rem.stop()
            await w.stop()

    asyncio.run(body())


def test_alertmanager_webhook_joins_and_dedups(tmp_path: Path) -> None:
    steps = (Step(ActionName.FALLBACK_TO_BASE, {}, 30.0),)

    async def body() -> None:
        w = FakeWorker()
        wurl = await w.start()
        clock = ManualClock(1_796_043_700.0)  # 2026-11-30T13:01:40Z
        ctx, _ = make_ctx(tmp_path, wurl, clock, mode="enforce")
        rem = await make_rem(ctx)
        runner, url = await serve(rem)
        try:
            async with httpx.AsyncClient(base_url=url) as c:
                # Without credentials: 401 and nothing happens.
                payload = am_payload("KcopsAttentionErrors", "firing")
                r = await c.post("/api/v1/alertmanager", json=payload)
                assert r.status_code == 401
                basic = base64.b64encode(b"alertmanager:wrong").decode()
                r = await c.post(
                    "/api/v1/alertmanager",
                    json=payload,
                    headers={"Authorization": f"Basic {basic}"},
                )
                assert r.status_code == 401
                assert rem.driver.ladders == {} and w.calls == []
                # The local rule fired first and its ladder ran.
                ctx.bus.publish(transition("KcopsAttentionErrors", "firing", clock(), steps))
                await settle(rem)
                assert len(w.calls) == 1
                # The cluster alert joins it (Basic auth, token as password).
                basic = base64.b64encode(f"alertmanager:{TOKEN}".encode()).decode()
                r = await c.post(
                    "/api/v1/alertmanager",
                    json=payload,
                    headers={"Authorization": f"Basic {basic}"},
                )
                assert r.status_code == 200 and r.json() == {"accepted": 1}
                await settle(rem)
                assert len(w.calls) == 1
                lad = rem.driver.ladders["KcopsAttentionErrors"]
                assert set(lad.instances.values()) == {"local", "alertmanager"}
                # Local resolves; the cluster alert still fires: ladder stays.
                ctx.bus.publish(transition("KcopsAttentionErrors", "inactive", clock()))
                assert "KcopsAttentionErrors" in rem.driver.ladders
                r = await c.post(
                    "/api/v1/alertmanager",
                    json=am_payload("KcopsAttentionErrors", "resolved"),
                    headers=AUTH,
                )
                assert "KcopsAttentionErrors" not in rem.driver.ladders
                # A late repeat of the same cluster incident does not run again.
                clock.advance(20)
                r = await c.post("/api/v1/alertmanager", json=payload, headers=AUTH)
                assert r.status_code == 200
                await settle(rem)
                assert rem.driver.ladders == {} and len(w.calls) == 1
                # A cluster alert with no local rule is ignored.
                r = await c.post(
                    "/api/v1/alertmanager", json=am_payload("SomethingElse", "firing"), headers=AUTH
                )
                assert rem.driver.ladders == {}
                r = await c.post("/api/v1/alertmanager", json={"version": "3"}, headers=AUTH)
                assert r.status_code == 400
        finally:
            await runner.cleanup()
            await rem.stop()
            await w.stop()
        events = [r["event"] for r in audit(rem, "alert")]
        assert events == ["joined", "deduplicated", "ignored"]

    asyncio.run(body())


def test_cluster_alert_starts_the_local_rules_ladder(tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        """
groups:
- name: kcops
  rules:
  - alert: KcopsKCSurge
    expr: vector(1)
    for: 5m
    remediation:
    - {action: scale_out, params: {step: 2}, verify: 2m}
"""
    )

    async def body() -> None:
        clock = ManualClock(1_796_000_000.0)
        ctx, _ = make_ctx(
            tmp_path / "state", None, clock, mode="enforce", scale={"hpa_reads_gauge": True}
        )
        ctx.config.rules.file = rules
        rem = await make_rem(ctx)
        runner, url = await serve(rem)
        try:
            async with httpx.AsyncClient(base_url=url) as c:
                r = await c.post(
                    "/api/v1/alertmanager", json=am_payload("KcopsKCSurge", "firing"), headers=AUTH
                )
                assert r.status_code == 200
            await settle(rem)
            await rem.tick(clock.advance(1))
            assert rem.replicas.desired == 3
            lad = rem.driver.ladders["KcopsKCSurge"]
            assert lad.steps[0].verify_s == 120.0 and lad.phase == "verify"
        finally:
            await runner.cleanup()
            await rem.stop()
        from kcops.agent.samples import SeriesKey

        assert ctx.store.latest(SeriesKey.of("kcops_desired_replicas")) is not None

    asyncio.run(body())
