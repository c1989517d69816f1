"""``evict_cache``: free KV cache in the engine and in the Redis KV tier."""

from __future__ import annotations

from typing import Literal

import redis.asyncio as aioredis
from pydantic import Field

from kcops.agent.actions.base import ActionContext, ActionResult, ActionSpec, Params
from kcops.agent.actions.redis_tier import evict_redis
from kcops.agent.errors import ActionRejected


class EvictParams(Params):
    policy: Literal["expired", "lru", "all"] = "expired"
    fraction: float = Field(0.5, ge=0.0, le=1.0, description="share of blocks/keys for lru")
    engine: bool = Field(True, description="evict in the engine")
    redis: bool = Field(True, description="evict in the Redis KV tier, when configured")


async def evict_cache(ctx: ActionContext, p: EvictParams) -> ActionResult:
    cfg = ctx.config.actions.evict
    data: dict[str, object] = {}
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    if p.engine and ctx.config.engine.url:
        out = await ctx.engine.evict(p.policy, p.fraction)
        data["engine"] = out
        if "before" in out:
            before["engine"] = out["before"]
        if "after" in out:
            after["engine"] = out["after"]
    if p.redis and cfg.redis_url:
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
    if not data:
        raise ActionRejected(
            "evict_cache: nothing to evict from (no engine.url, no actions.evict.redis_url)",
            "unsupported",
        )
    parts = []
    if isinstance(data.get("engine"), dict):
        eng = data["engine"]
        assert isinstance(eng, dict)
        parts.append(f"engine evicted {eng.get('evicted_blocks', '?')} blocks")
    if isinstance(data.get("redis"), dict):
        parts.append(f"redis unlinked {data['redis']['evicted_keys']} keys")  # type: ignore[index]
    return ActionResult(detail="; ".join(parts), before=before, after=after, data=data)


SPEC = ActionSpec(
    "evict_cache",
    evict_cache,
    EvictParams,
    "Evict KV cache (expired | lru | all) in the engine and the Redis KV tier (prefix only).",
)
