"""Odd key names survive the server-side batch encoding of evict_redis (one node)."""

from __future__ import annotations

import asyncio

import redis
import redis.asyncio as aioredis

from kcops.agent.actions.redis_tier import evict_redis

PREFIX = "kcops:kv:"
ODD = [
    PREFIX + "a b",
    PREFIX + "new\nline",
    PREFIX + "{tag}:kv",
    PREFIX + "{tag}:meta",
    PREFIX + " 12 3 ",
]


def test_keys_with_spaces_newlines_and_tags(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    for k in ODD:
        r.set(k, b"v")
    r.set("outside 1 2 3 kcops:kv:", b"keep")

    async def run(policy: str) -> dict[str, object]:
        c = aioredis.from_url(redis_url)
        try:
            return (await evict_redis(c, PREFIX, policy, 1.0, expired_idle_s=0)).to_json()
        finally:
            await c.aclose()

    out = asyncio.run(run("lru"))  # probe script + client-side choice + unlink script
    # 4 entries: the two {tag} keys are one entry
    assert out["evicted_keys"] == 5 and out["keys_before"] == 5
    assert r.dbsize() == 1 and r.get("outside 1 2 3 kcops:kv:") == b"keep"
    for k in ODD:
        r.set(k, b"v")
    out = asyncio.run(run("all"))  # scan-and-unlink script
    assert out["evicted_keys"] == 5 and r.dbsize() == 1
