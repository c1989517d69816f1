"""evict_cache on a real redis-server: only keys under the prefix are ever touched."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aioredis

from kcops.agent.actions.redis_tier import evict_redis
from tests.clock import ManualClock
from tests.unit.actions.harness import make_ctx, make_rem

PREFIX = "kcops:kv:"
# Keys that look close to the prefix but are outside it, and glob traps.
OTHERS = ["kcops:kvx:1", "kcops:kv", "other:kcops:kv:1", "session:42", "kcops:k*:1", "KCOPS:KV:1"]


def seed(url: str, n: int = 200) -> redis.Redis:
    r = redis.Redis.from_url(url)
    r.flushdb()
    for k in OTHERS:
        r.set(k, b"keep")
    for i in range(n):
        r.set(f"{PREFIX}seg:{i}", b"x" * 256)
    return r


def others_intact(r: redis.Redis) -> bool:
    return all(r.get(k) == b"keep" for k in OTHERS)


def test_all_and_expired(redis_url: str) -> None:
    r = seed(redis_url)

    async def body(policy: str, idle: float) -> dict[str, Any]:
        c = aioredis.from_url(redis_url)
        try:
            rep = await evict_redis(c, PREFIX, policy, 1.0, expired_idle_s=idle, batch=37)
        finally:
            await c.aclose()
        return rep.to_json()

    # Nothing has been idle for an hour: "expired" evicts nothing.
    out = asyncio.run(body("expired", 3600))
    assert out["evicted_keys"] == 0 and out["keys_before"] == 200
    # Idle >= 0 s: every key under the prefix is expired.
    out = asyncio.run(body("expired", 0))
    assert out["evicted_keys"] == 200 and out["freed_bytes"] > 200 * 256
    assert others_intact(r) and r.dbsize() == len(OTHERS)
    seed(redis_url, 50)
    out = asyncio.run(body("all", 0))
    assert out["evicted_keys"] == 50 and others_intact(r) and r.dbsize() == len(OTHERS)


def test_lru_takes_the_most_idle(redis_url: str) -> None:
    r = seed(redis_url, 0)
    # 10 old keys: OBJECT IDLETIME has 1 s resolution, so wait until Redis itself
    # reports them idle for 2 s (the condition, not a clock).
    for i in range(10):
        r.set(f"{PREFIX}old:{i}", b"o")
    import time

    deadline = time.monotonic() + 30
    while (r.object("idletime", f"{PREFIX}old:9") or 0) < 2:
        assert time.monotonic() < deadline, "old keys never reported idle"
        time.sleep(0.1)
    for i in range(10):
        r.set(f"{PREFIX}new:{i}", b"n")

    async def body() -> dict[str, Any]:
        c = aioredis.from_url(redis_url)
        try:
            rep = await evict_redis(c, PREFIX, "lru", 0.5, expired_idle_s=0, batch=3)
        finally:
            await c.aclose()
        return rep.to_json()

    out = asyncio.run(body())
    assert out["evicted_keys"] == 10
    left = sorted(k.decode() for k in r.scan_iter(f"{PREFIX}*"))
    assert left == sorted(f"{PREFIX}new:{i}" for i in range(10))
    assert others_intact(r)


def test_prefix_with_glob_characters(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.flushdb()
    r.set("kv[1]:a", b"1")
    r.set("kv1:a", b"keep")  # matches the unescaped glob kv[1]*

    async def body() -> int:
        c = aioredis.from_url(redis_url)
        try:
            return (await evict_redis(c, "kv[1]:", "all", 1.0, expired_idle_s=0)).evicted
        finally:
            await c.aclose()

    assert asyncio.run(body()) == 1
    assert r.get("kv1:a") == b"keep" and r.get("kv[1]:a") is None


def test_evict_cache_action_through_the_runner(redis_url: str, tmp_path: Path) -> None:
    r = seed(redis_url, 40)

    async def body() -> dict[str, Any]:
        ctx, _ = make_ctx(
            tmp_path,
            None,
            ManualClock(),
            mode="enforce",
            evict={"redis_url": redis_url, "redis_prefix": PREFIX, "expired_idle_s": 0},
        )
        rem = await make_rem(ctx)
        try:
            run = rem.runner.submit("evict_cache", {"policy": "expired"})
            assert run.task is not None
            await run.task
            assert run.outcome == "ok", run.error
            return run.record().as_json()
        finally:
            await rem.stop()

    rec = asyncio.run(body())
    assert rec["before"] == {"redis_keys": 40} and rec["after"] == {"redis_keys": 0}
    assert others_intact(r) and r.dbsize() == len(OTHERS)
