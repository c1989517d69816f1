"""Control API routes of remediation: actions, history, ladders, Alertmanager webhook.

Reads are open; running an action and the webhook need the bearer token
(or Basic auth with the token as password, as Alertmanager sends it).
Bodies are pydantic models checked strictly (``"force": "false"`` is a 422);
every bad input is a JSON 4xx. An answer that acknowledges something waits
until its audit records are on disk (:meth:`AuditLog.sync`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from kcops.agent.actions.alertmanager import OVER_CAP, TRUNCATED, BadPayload, parse_webhook
from kcops.agent.actions.audit import read_audit
from kcops.agent.actions.records import JSONObject, Trigger
from kcops.agent.jsonapi import json_dumps, read_json, read_json_model

if TYPE_CHECKING:
    from kcops.agent.actions.remediation import Remediation

log = logging.getLogger("kcops.agent.actions")

STATUS_OF = {
    "ok": 200,
    "dry_run": 200,
    "invalid": 422,
    "refused": 409,
    "failed": 500,
    "timeout": 504,
}


class RunActionBody(BaseModel):
    """``POST /api/v1/actions/{name}``."""

    model_config = ConfigDict(extra="forbid")

    params: dict[str, JsonValue] | None = None
    force: bool = False
    reason: str | None = Field(None, max_length=1000)
    dry_run: bool = False


def build_routes(rem: Remediation) -> list[web.RouteDef]:
    auth = rem.ctx.auth

    async def list_actions(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "mode": rem.config.actions.mode,
                "actions": [s.describe() for s in rem.registry.specs()],
                "guards": rem.guards.summary(rem.clock()),
            }
        )

    async def run_action(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = await read_json_model(request, RunActionBody)
        if name not in rem.registry:
            return web.json_response(
                {"error": f"unknown action {name!r}", "allowed": rem.registry.names()}, status=404
            )
        run = rem.runner.submit(
            name,
            body.params or {},
            trigger=Trigger(source="api", remote=request.remote),
            force=body.force,
            reason=body.reason,
            dry_run=body.dry_run,
        )
        if run.task is not None:
            timeout = rem.config.actions.guards.action_timeout_s + 5
            await asyncio.wait([run.task], timeout=timeout)
        durable = await rem.audit.sync()
        rec = run.record().as_json()
        if not durable:  # never acknowledge a record that is not on disk
            return web.json_response(not_durable(rem, rec), status=503, dumps=json_dumps)
        status = STATUS_OF.get(run.outcome or "", 409)
        return web.json_response(rec, status=status, dumps=json_dumps)

    async def history(request: web.Request) -> web.Response:
        since = request.query.get("since")
        try:
            since_f = float(since) if since else None
        except ValueError:
            since_f = float("nan")
        if since_f is not None and not 0 <= since_f < 1e11:
            return web.json_response({"error": "since must be Unix seconds"}, status=400)
        raw_limit = request.query.get("limit", "1000")
        limit = int(raw_limit) if raw_limit.isdecimal() and len(raw_limit) <= 7 else 0
        if not 1 <= limit <= 100_000:
            return web.json_response({"error": "limit must be an integer in 1..100000"}, status=400)

        def tail() -> list[JSONObject]:
            return list(deque(read_audit(rem.audit.path, since_f), maxlen=limit))

        # The audit log grows without bound: read it off the event loop.
        recs = await asyncio.to_thread(tail)
        return web.json_response({"records": recs}, dumps=json_dumps)

    async def remediation_status(_: web.Request) -> web.Response:
        return web.json_response(rem.status(), dumps=json_dumps)

    routes = [
        web.get("/api/v1/actions", list_actions),
        web.get("/api/v1/actions/history", history),
        web.get("/api/v1/remediation", remediation_status),
        web.get("/api/v1/engine/ready", engine_ready(rem)),
        web.post("/api/v1/actions/{name}", auth.require(run_action)),
    ]
    if rem.config.actions.alertmanager_webhook:
        routes.append(web.post("/api/v1/alertmanager", auth.require(webhook(rem))))
    return routes


def webhook(rem: Remediation) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``POST /api/v1/alertmanager``: Alertmanager's notifications as alert transitions
    (kcops.agent.actions.alertmanager); over the cap, what fits is taken and the rest
    counted, answered 200 so Alertmanager neither retries it nor loses what was taken."""

    async def alertmanager(request: web.Request) -> web.Response:
        payload = await read_json(request)
        try:
            delivery = parse_webhook(payload, rem.clock())
        except BadPayload as exc:
            return web.json_response({"error": str(exc)}, status=exc.status)
        for ev in delivery.events:
            rem.ctx.bus.publish(ev)
        counts = rem.webhook_dropped
        counts[OVER_CAP] = counts.get(OVER_CAP, 0) + delivery.dropped_total
        counts[TRUNCATED] = counts.get(TRUNCATED, 0) + delivery.truncated
        if delivery.dropped:
            log.warning("alertmanager webhook: %s", delivery.answer()["warning"])
        # The decisions are on disk before Alertmanager hears "ok"; else it sends again.
        if not await rem.audit.sync():
            return web.json_response(not_durable(rem, None), status=503, dumps=json_dumps)
        # 200 even with alerts dropped: a 4xx is not retried and would lose what was taken.
        return web.json_response(delivery.answer())

    return alertmanager


def not_durable(rem: Remediation, record: JSONObject | None) -> JSONObject:
    """The 503 answer while the audit log's disk refuses records (held, not acknowledged)."""
    audit = rem.audit
    return {
        "error": f"audit log not durable ({audit.last_error}): {audit.held} record(s) held "
        "in memory, written when the disk takes them; this one is not acknowledged",
        "record": record,
    }


def engine_ready(rem: Remediation) -> Callable[[web.Request], Awaitable[web.Response]]:
    """``GET /api/v1/engine/ready``, for a load balancer or a readinessProbe: 200 only
    while the engine takes work (ready by its health checks, no restart draining it),
    else 503 saying why."""

    async def handler(_: web.Request) -> web.Response:
        eng = rem.engine
        serving = eng.serving()
        body: JSONObject = {
            "serving": serving, "state": eng.state.value, "draining": eng.draining,
        }  # fmt: skip
        if not serving:
            why = f"draining: {eng.draining}" if eng.draining else f"engine {eng.state.value}"
            body["error"] = f"not serving ({why})"
        return web.json_response(body, status=200 if serving else 503)

    return handler
