"""The control API's own routes (health, readiness, status, metrics) and its edges.

Components add their routes (alerts, actions, webhook) through
:meth:`Component.routes`; reads are open, writes go through
:meth:`~kcops.auth.TokenCheck.require`.

Every answer to a bad request is JSON (``{"error": ...}``) with a 4xx status,
including aiohttp's own (404, 405, 413) and a :class:`~kcops.agent.jsonapi.BadRequest`
a handler raises (:mod:`kcops.agent.jsonapi` reads bodies strictly); a handler bug
answers a JSON 500 without a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler

from kcops.agent.exporter import StoreExporter
from kcops.agent.jsonapi import BadRequest, error_body, error_response, json_dumps
from kcops.httpedge import BODY_TIMEOUT_S, body_deadline, describe

log = logging.getLogger("kcops.agent.control")

MAX_BODY_BYTES = 1 << 20
# Alertmanager's webhook: max_alerts (1000) alerts of a few kB each, labels, annotations and
# a generatorURL holding the whole expression, do not fit in 1 MiB, and a 413 loses them all.
MAX_WEBHOOK_BYTES = 4 << 20
LARGE_BODIES = {"/api/v1/alertmanager": MAX_WEBHOOK_BYTES}


class Served(Protocol):
    """What the control API's own routes read of the running agent."""

    ticks_done: int
    exporter: StoreExporter

    def status(self) -> Mapping[str, object]: ...


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every failure as JSON: aiohttp's HTTP errors, refused input, handler bugs."""
    try:
        resp: web.StreamResponse = await handler(request)
        return resp
    except BadRequest as exc:
        return error_response(exc.status, exc.error, exc.details)
    except HttpProcessingError as exc:  # a body aiohttp could not read (broken chunks)
        return error_response(400, "bad HTTP request: " + describe(exc))
    except ConnectionResetError:  # the client hung up mid-body: nobody reads the answer
        log.debug("%s %s: the client went away", request.method, request.path)
        return error_response(400, "connection lost")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc.status, exc.reason or "error")
    except Exception as exc:  # a bug: the client gets no traceback, the log one line
        log.error("%s %s failed: %s: %s", request.method, request.path, type(exc).__name__, exc)
        return error_response(500, "internal error")


@web.middleware
async def body_limits(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A larger body limit where a request may rightly be larger (:data:`LARGE_BODIES`)."""
    limit = LARGE_BODIES.get(request.path)
    if limit is not None and request.method == "POST":
        request = request.clone(client_max_size=limit)
    return await handler(request)


def build_app(body_timeout_s: float = BODY_TIMEOUT_S) -> web.Application:
    """The aiohttp application: JSON errors, the body size limits, the body deadline."""
    return web.Application(
        middlewares=[json_errors, body_limits, body_deadline(error_body, body_timeout_s)],
        client_max_size=MAX_BODY_BYTES,
    )


def core_routes(agent: Served) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if agent.ticks_done < 1:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ready", "ticks": agent.ticks_done})

    async def status(_: web.Request) -> web.Response:
        return web.json_response(agent.status(), dumps=json_dumps)

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = await agent.exporter.scrape(request.headers.get("Accept"))
        resp = web.Response(body=body)
        # Set as a header: aiohttp's content_type argument refuses one with a charset.
        resp.headers["Content-Type"] = content_type
        return resp

    return [
        web.get("/healthz", healthz),
        web.get("/readyz", readyz),
        web.get("/api/v1/status", status),
        web.get("/metrics", metrics),
    ]
