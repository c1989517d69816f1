"""HTTP face of the worker (aiohttp): OpenAI completions, health, metrics, admin API.

Every response is JSON (``/metrics`` excepted). Mutating admin routes need the
bearer token (``KCOPS_TOKEN`` or ``--token-file``, via kcops.agent.auth); with no
token configured they answer 401. ``GET /admin/state`` is open.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kcops.agent.auth import TokenCheck
from kcops.worker.control import BadSetting, Control
from kcops.worker.engine import Engine, Event, GenRequest
from kcops.worker.faults import BadFault, Faults
from kcops.worker.metrics import LiveState, WorkerMetrics
from kcops.worker.redis_tier import RedisTier

EVICT_POLICIES = ("lru", "expired", "all")


class BadRequest(ValueError):
    pass


@dataclass
class WorkerState:
    engine: Engine
    control: Control
    faults: Faults
    metrics: WorkerMetrics
    model_name: str
    context_tokens: int
    tokens: TokenCheck
    redis: RedisTier | None = None
    cache_ttl_s: float = 3600.0
    enable_faults: bool = False
    admitting: bool = True
    in_flight: int = 0


def live_state(state: WorkerState) -> LiveState:
    eng = state.engine
    return LiveState(
        waiting=eng.waiting,
        running=eng.running,
        kv_cache_usage_perc=min(1.0, eng.cache.usage_ratio),
        top_n=state.control.budget.top_n,
        fallback=state.control.mode == "fallback",
        shadow_agreement=eng.shadow_agreement,
        kv_bytes=eng.kv_bytes,
    )


def _err(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    # OpenAI / vLLM error shape.
    body = {"error": {"message": message, "type": kind, "code": status}}
    return web.json_response(body, status=status)


async def _json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("request body is not valid JSON") from None


def _parse_completion(body: Any, state: WorkerState, tok: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = [int(t) for t in prompt]
        vocab = len(tok)
        if any(isinstance(t, bool) or not 0 <= t < vocab for t in ids):
            raise BadRequest(f"token ids in 'prompt' must be integers in [0, {vocab})")
    elif isinstance(prompt, str) and prompt:
        ids = tok(prompt, add_special_tokens=False).input_ids
    else:
        raise BadRequest("'prompt' is required: a non-empty string (or a list of token ids)")
    max_tokens = body.get("max_tokens", 16)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest(f"'max_tokens' must be an integer >= 1, got {max_tokens!r}")
    temperature = body.get("temperature", 1.0)
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise BadRequest(f"'temperature' must be a finite number >= 0, got {temperature!r}")
    if temperature < 1e-5:
        temperature = 0.0  # below this, softmax(logits / T) overflows: it is greedy anyway
    top_p = body.get("top_p", 1.0)
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise BadRequest(f"'top_p' must be in (0, 1], got {top_p!r}")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("'stop' must be a string or a list of non-empty strings")
    seed = body.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63
    ):
        raise BadRequest(f"'seed' must be an integer in [0, 2**63), got {seed!r}")
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("only n=1 is supported")
    if len(ids) + max_tokens > state.context_tokens:
        raise BadRequest(
            f"This model's maximum context length is {state.context_tokens} tokens. However, "
            f"you requested {len(ids) + max_tokens} tokens ({len(ids)} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the length."
        )
    return {
        "ids": ids,
        "max_tokens": max_tokens,
        "temperature": float(temperature),
        "top_p": float(top_p),
        "stop": stop,
        "seed": seed,
        "stream": bool(body.get("stream", False)),
    }


@web.middleware
async def json_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """aiohttp's own 404/405/413 answers, as JSON like every other response."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _err(exc.status, exc.reason or "error", type(exc).__name__)


def build_app(state: WorkerState) -> web.Application:
    app = web.Application(client_max_size=16 * 1024**2, middlewares=[json_errors])
    tok = state.engine.tok
    require = state.tokens.require

    async def hang_gate() -> None:
        # A hung worker does not answer: wait (forever, or until the drill is cleared).
        while state.faults.hang:
            await asyncio.sleep(0.2)

    async def health(request: web.Request) -> web.Response:
        await hang_gate()
        return web.json_response({"status": "ok"})

    async def models(request: web.Request) -> web.Response:
        card = {
            "id": state.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "kcops",
            "root": state.model_name,
            "max_model_len": state.context_tokens,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def version(request: web.Request) -> web.Response:
        # vLLM answers GET /version; engine auto-detection and health probes use it.
        from kcops import __version__

        return web.json_response({"version": __version__, "engine": "kcops"})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(
            body=state.metrics.exposition(), content_type="text/plain", charset="utf-8"
        )

    def _emitter(
        loop: asyncio.AbstractEventLoop, events: asyncio.Queue[Event]
    ) -> Callable[[Event], None]:
        def emit(ev: Event) -> None:
            # At shutdown the server's loop closes before the model thread has
            # finished its batch; its last events have no reader left to lose.
            if not loop.is_closed():
                try:
                    loop.call_soon_threadsafe(events.put_nowait, ev)
                except RuntimeError:
                    pass

        return emit

    async def completions(request: web.Request) -> web.StreamResponse:
        await hang_gate()
        if not state.admitting:
            return _err(503, "the worker is draining: not admitting new requests", "Unavailable")
        try:
            p = _parse_completion(await _json_body(request), state, tok)
        except BadRequest as exc:
            return _err(400, str(exc))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[Event] = asyncio.Queue()
        req = GenRequest(
            prompt_ids=p["ids"],
            max_tokens=p["max_tokens"],
            emit=_emitter(loop, events),
            temperature=p["temperature"],
            top_p=p["top_p"],
            stop=p["stop"],
            seed=p["seed"],
        )
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        state.in_flight += 1
        try:
            state.engine.submit(req)
            if p["stream"]:
                return await _stream(request, events, req, rid, created)
            text: list[str] = []
            while True:
                ev = await events.get()
                if ev.kind == "delta":
                    text.append(ev.text)
                elif ev.kind == "error":
                    return _err(500, ev.text, "InternalServerError")
                else:
                    break
            choice = {
                "index": 0,
                "text": "".join(text),
                "logprobs": None,
                "finish_reason": ev.finish_reason,
            }
            return web.json_response(
                {
                    "id": rid,
                    "object": "text_completion",
                    "created": created,
                    "model": state.model_name,
                    "choices": [choice],
                    "usage": ev.usage,
                    "kcops": {
                        "route": req.route,
                        "top_n": req.top_n,
                        "cached_tokens": req.cached_tokens,
                    },
                }
            )
        except asyncio.CancelledError:
            req.cancelled = True
            raise
        finally:
            state.in_flight -= 1

    async def _stream(
        request: web.Request, events: asyncio.Queue[Event], req: GenRequest, rid: str, created: int
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await resp.prepare(request)

        async def send(text: str, finish: str | None, usage: Any = None) -> None:
            chunk: dict[str, Any] = {
                "id": rid,
                "object": "text_completion",
                "created": created,
                "model": state.model_name,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            }
            if usage is not None:
                chunk["usage"] = usage
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())

        try:
            while True:
                ev = await events.get()
                if ev.kind == "delta":
                    await send(ev.text, None)
                elif ev.kind == "error":
                    err = {"error": {"message": ev.text, "type": "InternalServerError"}}
                    await resp.write(f"data: {json.dumps(err)}\n\n".encode())
                    break
                else:
                    await send("", ev.finish_reason, ev.usage)
                    break
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            req.cancelled = True
            raise
        return resp

    # -- admin ---------------------------------------------------------------
    def cache_view() -> dict[str, Any]:
        c = state.engine.cache
        return {"usage_ratio": c.usage_ratio, "blocks": c.blocks}

    # The model thread holds the cache lock during Redis round trips (spill and
    # reload): take it in a worker thread so the event loop (health, metrics,
    # streams) never waits on Redis.
    async def reset_prefix_cache(request: web.Request) -> web.Response:
        def reset() -> int:
            with state.engine.cache_lock:
                return state.engine.cache.evict("all")[0]

        blocks = await asyncio.to_thread(reset)
        return web.json_response({"reset": True, "evicted_blocks": blocks})

    async def admin_evict(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise BadRequest("expected a JSON object")
            policy = body.get("policy", "lru")
            fraction = body.get("fraction", 1.0)
            if policy not in EVICT_POLICIES:
                raise BadRequest(f"policy {policy!r}: use one of {', '.join(EVICT_POLICIES)}")
            if isinstance(fraction, bool) or not isinstance(fraction, int | float):
                raise BadRequest(f"fraction must be a number in [0, 1], got {fraction!r}")
            if not 0 <= fraction <= 1:
                raise BadRequest(f"fraction must be in [0, 1], got {fraction!r}")
        except BadRequest as exc:
            return _err(400, str(exc))
        eng = state.engine

        def evict() -> tuple[dict[str, Any], int, int, dict[str, Any]]:
            with eng.cache_lock:
                before = cache_view()
                blocks, freed = eng.cache.evict(
                    policy, fraction=float(fraction), ttl_s=state.cache_ttl_s, now=eng.clock()
                )
                return before, blocks, freed, cache_view()

        before, blocks, freed, after = await asyncio.to_thread(evict)
        return web.json_response(
            {
                "policy": policy,
                "evicted_blocks": blocks,
                "freed_bytes": freed,
                "before": before,
                "after": after,
            }
        )

    async def admin_route(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            if not isinstance(body, dict) or "mode" not in body:
                raise BadRequest('expected {"mode": "normal"|"fallback"}')
            before, after = state.control.set_mode(body["mode"])
        except (BadRequest, BadSetting) as exc:
            return _err(400, str(exc))
        return web.json_response({"before": before, "after": after})

    async def admin_attention(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            if not isinstance(body, dict):
                raise BadRequest("expected a JSON object")
            unknown = set(body) - {"top_n", "top_n_by_layer", "dense_layers"}
            if unknown:
                raise BadRequest(f"unknown field(s) {sorted(unknown)}")
            before, after = state.control.set_budget(
                top_n=body.get("top_n"),
                top_n_by_layer=body.get("top_n_by_layer"),
                dense_layers=body.get("dense_layers"),
            )
        except (BadRequest, BadSetting) as exc:
            return _err(400, str(exc))
        return web.json_response({"before": before.as_json(), "after": after.as_json()})

    async def admin_drain(request: web.Request) -> web.Response:
        try:
            body = await _json_body(request)
            if not isinstance(body, dict) or not isinstance(body.get("admit"), bool):
                raise BadRequest('expected {"admit": false|true}')
        except BadRequest as exc:
            return _err(400, str(exc))
        state.admitting = body["admit"]
        return web.json_response({"admitting": state.admitting, "in_flight": state.in_flight})

    async def admin_state(request: web.Request) -> web.Response:
        eng, c, b = state.engine, state.engine.cache, state.control.budget
        return web.json_response(
            {
                "pid": os.getpid(),
                "model": state.model_name,
                "route_mode": state.control.mode,
                **b.as_json(),
                "top_n_bounds": [state.control.topn_min, state.control.topn_max],
                "long_threshold": state.control.long_threshold,
                "admitting": state.admitting,
                "in_flight": state.in_flight,
                "cache": {
                    "blocks": c.blocks,
                    "bytes": c.bytes,
                    "budget_bytes": c.budget_bytes,
                    "usage_ratio": c.usage_ratio,
                    "hits": c.stats.hits,
                    "queries": c.stats.queries,
                    "redis_hits": c.stats.redis_hits,
                    "ttl_s": state.cache_ttl_s,
                },
                "redis": state.redis.state() if state.redis is not None else None,
                "faults": {"enabled": state.enable_faults, **state.faults.state()},
                "shadow": {
                    "fraction": eng.shadow_fraction,
                    "checks": eng.shadow_checks,
                    "agreement_ratio": eng.shadow_agreement,
                },
            }
        )

    async def admin_faults(request: web.Request) -> web.Response:
        try:
            result = state.faults.apply(await _json_body(request))
        except (BadRequest, BadFault) as exc:
            return _err(400, str(exc))
        return web.json_response(result)

    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/reset_prefix_cache", require(reset_prefix_cache))
    app.router.add_post("/admin/cache/evict", require(admin_evict))
    app.router.add_post("/admin/route", require(admin_route))
    app.router.add_post("/admin/attention", require(admin_attention))
    app.router.add_post("/admin/drain", require(admin_drain))
    guarded_faults = require(admin_faults)

    async def faults_route(request: web.Request) -> web.StreamResponse:
        if not state.enable_faults:
            return _err(404, "fault injection is off: start with --enable-faults", "NotFound")
        return await guarded_faults(request)

    app.router.add_post("/admin/faults", faults_route)
    app.router.add_get("/admin/state", admin_state)
    return app
