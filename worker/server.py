"""HTTP face of the worker (aiohttp): the route table, errors as JSON, the token check.

The handlers live in :mod:`kcops.worker.openai_api` (OpenAI endpoints) and
:mod:`kcops.worker.admin` (admin API); request bodies are the pydantic models of
:mod:`kcops.worker.protocol`. Every response is JSON (``/metrics`` and streams
excepted); every error has the OpenAI shape ``{"error": {message, type, param,
code}}`` except the 401 of the shared token check. Mutating admin routes need the
bearer token (``KCOPS_TOKEN`` or ``--token-file``); with no token configured they
answer 401. ``GET /admin/state`` is open.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from kcops.auth import Handler, TokenCheck
from kcops.httpedge import BODY_TIMEOUT_S, body_deadline, describe
from kcops.worker import admin, openai_api
from kcops.worker.protocol import ApiError
from kcops.worker.state import STATE, WorkerState, hang_gate, live_state, state_of

__all__ = ["WorkerState", "build_app", "live_state"]
log = logging.getLogger("kcops.worker")


def error_response(exc: ApiError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


def error_body(status: int, message: str) -> dict[str, object]:
    """The OpenAI-shaped body of aiohttp's own protocol errors (kcops.httpedge)."""
    code = "bad_request" if status < 500 else "internal_error"
    return ApiError(message, status, code=code).body()


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """ApiErrors and aiohttp's own 404/405/413 answers as JSON; a bug as a JSON 500."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except HttpProcessingError as exc:  # a body aiohttp could not read (broken chunks)
        return error_response(ApiError("bad HTTP request: " + describe(exc), 400))
    except ConnectionResetError:  # the client hung up mid-body: nobody reads the answer
        log.debug("%s %s: the client went away", request.method, request.path)
        return error_response(ApiError("connection lost", 400))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = (exc.reason or "error").lower().replace(" ", "_")
        return error_response(ApiError(exc.reason or "error", exc.status, code=code))
    except Exception as exc:
        # A bug: no traceback reaches a client, the log gets one line naming it.
        log.error("request %s %s failed: %s", request.method, request.path, describe(exc))
        return error_response(ApiError("internal error (see the worker's log)", 500))


def guarded(tokens: TokenCheck, handler: Handler) -> Handler:
    """The token check, after refusing credentials that are not UTF-8 (401, not a 500)."""
    checked = tokens.require(handler)

    async def wrapped(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        try:
            auth.encode("utf-8")
        except UnicodeEncodeError:  # aiohttp keeps undecodable bytes as surrogates
            return web.json_response(
                {"error": "unauthorized", "detail": "Authorization header is not UTF-8"},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="kcops"'},
            )
        return await checked(request)

    return wrapped


async def health(request: web.Request) -> web.Response:
    await hang_gate(state_of(request))
    return web.json_response({"status": "ok"})


async def version(request: web.Request) -> web.Response:
    # vLLM answers GET /version; engine auto-detection and health probes use it.
    from kcops import __version__

    return web.json_response({"version": __version__, "engine": "kcops"})


async def metrics(request: web.Request) -> web.Response:
    body, content_type = state_of(request).metrics.exposition(request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


async def faults_route(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    if not state.enable_faults:
        raise ApiError("fault injection is off: start with --enable-faults", 404)
    return await guarded(state.tokens, admin.faults)(request)


def build_app(state: WorkerState) -> web.Application:
    app = web.Application(
        client_max_size=16 * 1024**2,
        middlewares=[json_errors, body_deadline(error_body, BODY_TIMEOUT_S)],
    )
    app[STATE] = state
    r = app.router
    r.add_get("/health", health)
    r.add_get("/version", version)
    r.add_get("/metrics", metrics)
    r.add_get("/v1/models", openai_api.models)
    r.add_post("/v1/completions", openai_api.completions)
    r.add_post("/v1/chat/completions", openai_api.chat_completions)
    for path, handler in (
        ("/reset_prefix_cache", admin.reset_prefix_cache),
        ("/admin/cache/evict", admin.evict),
        ("/admin/route", admin.route),
        ("/admin/attention", admin.attention),
        ("/admin/drain", admin.drain),
    ):
        r.add_post(path, guarded(state.tokens, handler))
    r.add_post("/admin/faults", faults_route)
    r.add_get("/admin/state", admin.admin_state)
    return app
