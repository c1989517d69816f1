"""Control API routes of remediation: actions, history, ladders, Alertmanager webhook.

Reads are open; running an action and the webhook need the bearer token
(or Basic auth with the token as password, as Alertmanager sends it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kcops.agent.actions.alertmanager import BadPayload, transitions
from kcops.agent.actions.audit import read_audit

if TYPE_CHECKING:
    from kcops.agent.actions.remediation import Remediation

STATUS_OF = {
    "ok": 200,
    "dry_run": 200,
    "invalid": 422,
    "refused": 409,
    "failed": 500,
    "timeout": 504,
}


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
        try:
            body: Any = await request.json() if request.can_read_body else {}
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        params = body.get("params") or {}
        if not isinstance(params, dict):
            return web.json_response({"error": "'params' must be an object"}, status=400)
        if name not in rem.registry:
            return web.json_response(
                {"error": f"unknown action {name!r}", "allowed": rem.registry.names()}, status=404
            )
        run = rem.runner.submit(
            name,
            params,
            trigger={"source": "api", "remote": request.remote},
            force=bool(body.get("force", False)),
            reason=body.get("reason"),
            dry_run=bool(body.get("dry_run", False)),
        )
        if run.task is not None:
            timeout = rem.config.actions.guards.action_timeout_s + 5
            await asyncio.wait([run.task], timeout=timeout)
        rec = run.record()
        status = STATUS_OF.get(run.outcome or "", 409)
        return web.json_response(rec, status=status, dumps=_dumps)

    async def history(request: web.Request) -> web.Response:
        since = request.query.get("since")
        try:
            since_f = float(since) if since else None
        except ValueError:
            return web.json_response({"error": "since must be Unix seconds"}, status=400)
        try:
            limit = int(request.query.get("limit", "1000"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100_000:
            return web.json_response({"error": "limit must be an integer in 1..100000"}, status=400)

        def tail() -> list[dict[str, Any]]:
            return list(deque(read_audit(rem.audit.path, since_f), maxlen=limit))

        # The audit log grows without bound: read it off the event loop.
        recs = await asyncio.to_thread(tail)
        return web.json_response({"records": recs}, dumps=_dumps)

    async def remediation_status(_: web.Request) -> web.Response:
        return web.json_response(rem.status(), dumps=_dumps)

    async def alertmanager(request: web.Request) -> web.Response:
        try:
            payload = await request.json()
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        try:
            events = transitions(payload, rem.clock())
        except BadPayload as exc:
            return web.json_response({"error": str(exc)}, status=400)
        for ev in events:
            rem.ctx.bus.publish(ev)
        return web.json_response({"accepted": len(events)})

    routes = [
        web.get("/api/v1/actions", list_actions),
        web.get("/api/v1/actions/history", history),
        web.get("/api/v1/remediation", remediation_status),
        web.post("/api/v1/actions/{name}", auth.require(run_action)),
    ]
    if rem.config.actions.alertmanager_webhook:
        routes.append(web.post("/api/v1/alertmanager", auth.require(alertmanager)))
    return routes


def _dumps(obj: Any) -> str:
    import json

    return json.dumps(obj, default=str)
