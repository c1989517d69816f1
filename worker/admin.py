"""The worker's admin API: cache eviction, route mode, attention budget, drain, faults, state.

Mutating routes are wrapped by the bearer-token check in :mod:`kcops.worker.server`.
The model thread holds the cache lock during Redis round trips (spill and reload):
cache calls take it in a worker thread so the event loop (health, metrics, streams)
never waits on Redis.
"""

from __future__ import annotations

import asyncio
import os

from aiohttp import web

from kcops.worker.cache import release_freed_memory
from kcops.worker.control import BadSetting
from kcops.worker.faults import BadFault
from kcops.worker.protocol import (
    ApiError,
    AttentionBody,
    DrainBody,
    EvictBody,
    RouteBody,
    parse,
    parse_json,
)
from kcops.worker.state import WorkerState, state_of


def cache_view(state: WorkerState) -> dict[str, object]:
    c = state.engine.cache
    return {"usage_ratio": c.usage_ratio, "blocks": c.blocks}


async def reset_prefix_cache(request: web.Request) -> web.Response:
    eng = state_of(request).engine

    def reset() -> int:
        with eng.cache_lock:
            blocks = eng.cache.evict("all")[0]
        release_freed_memory()
        return blocks

    blocks = await asyncio.to_thread(reset)
    return web.json_response({"reset": True, "evicted_blocks": blocks})


async def evict(request: web.Request) -> web.Response:
    state = state_of(request)
    body = parse(EvictBody, await request.read())
    eng = state.engine

    def run() -> tuple[dict[str, object], int, int, dict[str, object]]:
        with eng.cache_lock:
            before = cache_view(state)
            blocks, freed = eng.cache.evict(
                body.policy, fraction=body.fraction, ttl_s=state.cache_ttl_s, now=eng.clock()
            )
            after = cache_view(state)
        release_freed_memory()  # freed blocks become memory the device sees as free
        return before, blocks, freed, after

    before, blocks, freed, after = await asyncio.to_thread(run)
    return web.json_response(
        {
            "policy": body.policy,
            "evicted_blocks": blocks,
            "freed_bytes": freed,
            "before": before,
            "after": after,
        }
    )


async def route(request: web.Request) -> web.Response:
    body = parse(RouteBody, await request.read())
    try:
        before, after = state_of(request).control.set_mode(body.mode)
    except BadSetting as exc:
        raise ApiError(str(exc), param="mode") from None
    return web.json_response({"before": before, "after": after})


async def attention(request: web.Request) -> web.Response:
    body = parse(AttentionBody, await request.read())
    try:
        before, after = state_of(request).control.set_budget(
            top_n=body.top_n, top_n_by_layer=body.top_n_by_layer, dense_layers=body.dense_layers
        )
    except BadSetting as exc:
        raise ApiError(str(exc)) from None
    return web.json_response({"before": before.as_json(), "after": after.as_json()})


async def drain(request: web.Request) -> web.Response:
    state = state_of(request)
    state.admitting = parse(DrainBody, await request.read()).admit
    return web.json_response({"admitting": state.admitting, "in_flight": state.in_flight})


async def faults(request: web.Request) -> web.Response:
    state = state_of(request)
    try:
        # In a thread: a cache resize waits for the cache lock, which the model
        # thread holds across Redis round trips.
        result = await asyncio.to_thread(state.faults.apply, parse_json(await request.read()))
    except BadFault as exc:
        raise ApiError(str(exc)) from None
    return web.json_response(result)


async def admin_state(request: web.Request) -> web.Response:
    state = state_of(request)
    eng, c, b = state.engine, state.engine.cache, state.control.budget
    cache = {
        "blocks": c.blocks,
        "bytes": c.bytes,
        "budget_bytes": c.budget_bytes,
        "usage_ratio": c.usage_ratio,
        "hits": c.stats.hits,
        "queries": c.stats.queries,
        "redis_hits": c.stats.redis_hits,
        "ttl_s": state.cache_ttl_s,
    }
    shadow = {
        "fraction": eng.shadow_fraction,
        "checks": eng.shadow_checks,
        "agreement_ratio": eng.shadow_agreement,
    }
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
            "cache": cache,
            "redis": state.redis.state() if state.redis is not None else None,
            "faults": {"enabled": state.enable_faults, **state.faults.state()},
            "shadow": shadow,
        }
    )
