"""``evict_cache``: free KV cache in the engine and in the Redis KV tier.

The engine must be able to do the asked policy (a partial eviction never
becomes a full reset: ``lru`` on vLLM is refused); its answer is read, so
vLLM's ``200 {"success": false}`` is ``failed`` with its reason. Before and
after come from the engine's own series in the store (KV usage, prefix cache),
with the kcops worker's block counts when it reports them.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Check,
    JSONObject,
    Params,
)
from kcops.agent.engine import series
from kcops.agent.outcome import ActionName, ActionRejected, Refusal

# How long to wait for a scrape after the eviction, for "after" (a few ticks).
AFTER_WAIT_S = 5.0


class EvictParams(Params):
    policy: Literal["expired", "lru", "all"] = "expired"
    fraction: float = Field(0.5, ge=0.0, le=1.0, description="share of blocks/keys for lru")
    engine: bool = Field(True, description="evict in the engine")
    redis: bool = Field(True, description="evict in the Redis KV tier, when configured")
    drop_running: bool = Field(
        False,
        description="a full reset may also free running requests' blocks "
        "(vLLM reset_running_requests); they are preempted and recomputed",
    )


def applicable(check: Check, p: EvictParams) -> None:
    use_engine = p.engine and check.config.engine.url is not None
    use_redis = p.redis and check.config.actions.evict.redis_url is not None
    if not use_engine and not use_redis:
        raise ActionRejected(
            "evict_cache: nothing to evict from (no engine.url, no actions.evict.redis_url)",
            Refusal.NOT_CONFIGURED,
        )
    if use_engine:
        check.engine.require("evict", policy=p.policy)


async def _evict_engine(ctx: ActionContext, p: EvictParams) -> dict[str, Any]:
    adapter = ctx.engine.adapter
    before = series.read(ctx.store, adapter) if ctx.store is not None else {}
    t0 = time.monotonic()
    out = await ctx.engine.evict(p.policy, p.fraction, drop_running=p.drop_running)
    # "after" is a scrape taken once the engine answered, not one from during the call
    returned_at = ctx.now + (time.monotonic() - t0)
    after: dict[str, Any] = {}
    if ctx.store is not None and before.get("t") is not None:
        after = await series.after(ctx.store, adapter, returned_at, AFTER_WAIT_S)
    own_before, own_after = out.get("before"), out.get("after")
    return {
        "answer": out,
        # The engine's series, plus the kcops worker's own block counts when it reports them.
        "before": {**before, **(own_before if isinstance(own_before, dict) else {})},
        "after": {**after, **(own_after if isinstance(own_after, dict) else {})},
    }


def _describe(eng: dict[str, Any] | None, redis_keys: int | None) -> str:
    parts = []
    if eng is not None:
        answer = eng["answer"]
        if "evicted_blocks" in answer:
            parts.append(f"engine evicted {answer['evicted_blocks']} blocks")
        else:
            parts.append(f"engine cache reset ({answer.get('route', 'all')})")
        b = eng["before"].get("kv_cache_usage_ratio")
        a = eng["after"].get("kv_cache_usage_ratio")
        if b is not None:
            parts[-1] += f", kv usage {b:.3f} -> " + (f"{a:.3f}" if a is not None else "?")
    if redis_keys is not None:
        parts.append(f"redis unlinked {redis_keys} keys")
    return "; ".join(parts)


async def evict_cache(ctx: ActionContext, p: EvictParams) -> ActionResult:
    cfg = ctx.config.actions.evict
    data: JSONObject = {}
    before: JSONObject = {}
    after: JSONObject = {}
    eng = None
    if p.engine and ctx.config.engine.url:
        eng = await _evict_engine(ctx, p)
        data["engine"] = eng["answer"]
        before["engine"], after["engine"] = eng["before"], eng["after"]
    redis_keys = None
    if p.redis and cfg.redis_url:
        # redis-py costs ~12 MiB of RSS at import: only an agent that evicts from Redis pays it.
        import redis.asyncio as aioredis

        from kcops.agent.actions.redis_tier import evict_redis

        client = aioredis.from_url(cfg.redis_url)
        try:
            rep = await evict_redis(
                client,
                cfg.redis_prefix,
                p.policy,
                p.fraction,
                expired_idle_s=cfg.expired_idle_s,
                scan_count=cfg.scan_count,
                batch=cfg.batch,
                max_seconds=cfg.max_seconds,
            )
        finally:
            await client.aclose()
        data["redis"] = rep.to_json()
        before["redis_keys"] = rep.keys_before
        after["redis_keys"] = rep.keys_before - rep.evicted
        redis_keys = rep.evicted
    return ActionResult(detail=_describe(eng, redis_keys), before=before, after=after, data=data)


SPEC = ActionSpec(
    ActionName.EVICT_CACHE,
    evict_cache,
    EvictParams,
    "Evict KV cache (expired | lru | all, as the engine supports) in the engine and the "
    "Redis KV tier (prefix only).",
    precheck=applicable,
)
