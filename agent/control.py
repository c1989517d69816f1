"""The control API's own routes (health, readiness, status, metrics) and its edges.

Components add their routes (alerts, actions, webhook) through
:meth:`Component.routes`; reads are open, writes go through
:meth:`~kcops.auth.TokenCheck.require`.

Every answer to a bad request is JSON (``{"error": ...}``) with a 4xx status,
including aiohttp's own (404, 405, 413); a handler bug answers a JSON 500
without a traceback. :func:`read_json_model` parses a body into a pydantic
model (strict: ``"false"`` is not a boolean) or answers 400/422. An agent that
would listen beyond loopback with no token refuses to start
(:func:`check_exposure`): its read routes would be open to the network.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Handler
from pydantic import BaseModel, ValidationError

from kcops.agent.exporter import render
from kcops.errors import ConfigError
from kcops.httpedge import BODY_TIMEOUT_S, body_deadline, describe

if TYPE_CHECKING:
    from kcops.agent.app import Agent

log = logging.getLogger("kcops.agent.control")

MAX_BODY_BYTES = 1 << 20
# Alertmanager's webhook: max_alerts (1000) alerts of a few kB each, labels, annotations and
# a generatorURL holding the whole expression, do not fit in 1 MiB, and a 413 loses them all.
MAX_WEBHOOK_BYTES = 4 << 20
LARGE_BODIES = {"/api/v1/alertmanager": MAX_WEBHOOK_BYTES}
M = TypeVar("M", bound=BaseModel)


class BadRequest(Exception):
    """A request the API refuses; becomes a JSON answer with ``status``."""

    def __init__(self, status: int, error: str, details: list[dict[str, str]] | None = None):
        super().__init__(error)
        self.status = status
        self.error = error
        self.details = details or []


def json_dumps(obj: object) -> str:
    """JSON text of ``obj`` with NaN and infinities as null: JSON has no such numbers
    (clients choke on a bare NaN). For every answer that may hold a measured float."""
    return json.dumps(_jsonable(obj), default=str)


def _jsonable(obj: object) -> object:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def error_body(status: int, error: str) -> dict[str, object]:
    """The JSON body of every error answer (also aiohttp's protocol errors, kcops.httpedge)."""
    del status  # the status line carries it
    return {"error": error[:500]}


def error_response(
    status: int, error: str, details: list[dict[str, str]] | None = None
) -> web.Response:
    body = error_body(status, error)
    if details:
        body["details"] = details[:20]
    return web.json_response(body, status=status)


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


class _NotJson(ValueError):
    pass


def _constant(name: str) -> object:
    raise _NotJson(f"bare {name} is not JSON (RFC 8259 has no such number)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"the number {text[:40]} is out of range")
    return value


def _no_repeats(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _NotJson(f"the key {key[:60]!r} appears twice in one object")
            seen.add(key)
    return out


def strict_json(text: str) -> object:
    """``json.loads`` without Python's extensions: no bare ``NaN``/``Infinity``, no number
    that overflows to infinity (``1e999``), no key twice in one object."""
    return json.loads(
        text, parse_constant=_constant, parse_float=_finite, object_pairs_hook=_no_repeats
    )


async def read_json(request: web.Request) -> object:
    """The JSON body (strict: :func:`strict_json`), or BadRequest 400 (not JSON, not UTF-8,
    nested too deeply, NaN)."""
    raw = await request.read()
    try:
        return strict_json(raw.decode("utf-8")) if raw else {}
    except _NotJson as exc:
        raise BadRequest(400, f"body is not a JSON document: {exc}") from None
    except (ValueError, RecursionError):
        raise BadRequest(400, "body is not a JSON document (UTF-8)") from None


async def read_json_model(request: web.Request, model: type[M]) -> M:
    """The body validated by ``model`` (strict types), or BadRequest 400/422 naming the fields."""
    body = await read_json(request)
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as exc:
        details = [
            {"field": ".".join(str(p) for p in e["loc"]) or "<body>", "problem": e["msg"][:200]}
            for e in exc.errors()
        ]
        raise BadRequest(422, "invalid request body", details) from None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: assume it is reachable


def check_exposure(host: str, token_configured: bool) -> None:
    """Refuse (ConfigError, exit 2) to listen beyond loopback without a token."""
    if not token_configured and not is_loopback(host):
        raise ConfigError(
            f"agent.listen: {host!r} is not a loopback address and no token is configured: "
            "the control API would be open to the network. Set KCOPS_TOKEN or --token-file, "
            "or listen on 127.0.0.1"
        )


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


def core_routes(agent: Agent) -> list[web.RouteDef]:
    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if agent.ticks_done < 1:
            return web.json_response({"status": "starting"}, status=503)
        return web.json_response({"status": "ready", "ticks": agent.ticks_done})

    async def status(_: web.Request) -> web.Response:
        return web.json_response(agent.status(), dumps=json_dumps)

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
