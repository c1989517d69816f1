"""The control API's own routes: health, readiness, status, metrics.

Components add their routes (alerts, actions, webhook) through
:meth:`Component.routes`; reads are open, writes go through
:meth:`~kcops.auth.TokenCheck.require`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from kcops.agent.exporter import render

if TYPE_CHECKING:
    from kcops.agent.app import Agent


def core_routes(agent: Agent) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if agent.ticks_done < 1:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ready", "ticks": agent.ticks_done})

    async def status(_: web.Request) -> web.Response:
        return web.json_response(agent.status())

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = render(agent.registry, request.headers.get("Accept"))
        ctype, _, params = content_type.partition(";")
        resp = web.Response(body=body)
        # aiohttp wants charset apart from the media type.
        resp.headers["Content-Type"] = content_type
        del ctype, params
        return resp

    return [
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/api/v1/status", status),
        web.get("/metrics", metrics),
    ]
