"""The fleet lease on Redis: a lock key with a fencing token, the state in a hash
beside it, written by one Lua script (see :mod:`.lease_core`)."""

from __future__ import annotations

import time
from typing import Any

from kcops.agent.actions.lease_core import FleetState, FleetWrite, Grant, busy, opt_float
from kcops.agent.outcome import ActionRejected, Refusal

_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local tok = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok, 'PX', ARGV[2])
return {1, tok}
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: lock, state. ARGV: holder|token, token, now, cooldown, min, base, hold_until, done_at
_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'lost' end
local last = tonumber(redis.call('HGET', KEYS[2], 'fence') or '0')
if tonumber(ARGV[2]) <= last then return 'stale' end
local done = redis.call('HGET', KEYS[2], 'done_at')
if ARGV[8] ~= '' and done and tonumber(ARGV[3]) - tonumber(done) < tonumber(ARGV[4]) then
  return 'cooldown'
end
redis.call('HSET', KEYS[2], 'fence', ARGV[2], 'min_replicas', ARGV[5], 'base_min', ARGV[6],
  'hold_until', ARGV[7], 'done_by', ARGV[1])
if ARGV[8] ~= '' then redis.call('HSET', KEYS[2], 'done_at', ARGV[8]) end
return 'ok'
"""


async def open_redis(url: str) -> Any:
    """``redis.asyncio.Redis`` for a single node, ``RedisCluster`` for a cluster node."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    node = aioredis.Redis.from_url(url, socket_timeout=5.0)
    try:
        info = await node.info("cluster")
    except Exception:
        await node.aclose()
        raise
    if not int(info.get("cluster_enabled", 0)):
        return node
    await node.aclose()
    cluster = RedisCluster.from_url(url, socket_timeout=5.0)
    await cluster.initialize()
    return cluster


class RedisFleet:
    """The fleet lease and state in Redis (one node or a cluster)."""

    def __init__(self, url: str, name: str, duration_s: float, floor: int) -> None:
        self.url = url
        self.name = name
        self.duration_s = duration_s
        self.floor = floor
        tag = "{kcops:fleet:" + name + "}"
        self.k_lock, self.k_fence, self.k_state = tag + ":lock", tag + ":fence", tag + ":state"
        self._client: Any = None

    async def client(self) -> Any:
        """A plain client for one node; a ``RedisCluster`` when the node is in cluster
        mode (a plain client would get MOVED for every slot another master owns)."""
        if self._client is None:
            self._client = await open_redis(self.url)
        return self._client

    async def acquire(self, holder: str, now: float) -> Grant:
        ms = str(int(self.duration_s * 1000))
        ok, val = await (await self.client()).eval(
            _ACQUIRE, 2, self.k_lock, self.k_fence, holder, ms
        )
        if not ok:
            raise busy(self.name, val.decode() if isinstance(val, bytes) else str(val))
        return Grant(holder, int(val), self.duration_s, time.monotonic())

    async def release(self, grant: Grant) -> None:
        await (await self.client()).eval(_RELEASE, 1, self.k_lock, f"{grant.holder}|{grant.token}")

    async def read(self) -> FleetState:
        h = await (await self.client()).hgetall(self.k_state)
        floor = int(h.get(b"min_replicas", self.floor))
        by = h.get(b"done_by")
        return FleetState(
            min_replicas=floor,
            replicas=floor,
            base_min=None if h.get(b"base_min", b"") == b"" else int(h[b"base_min"]),
            hold_until=opt_float(h.get(b"hold_until")),
            done_at=opt_float(h.get(b"done_at")),
            done_by=by.decode() if by else None,
            fence=int(h.get(b"fence", 0)),
        )

    async def write(self, grant: Grant, w: FleetWrite, cooldown_s: float, now: float) -> None:
        grant.check()

        def s(v: float | int | None) -> str:
            return "" if v is None else repr(v)

        res = await (await self.client()).eval(
            _WRITE,
            2,
            self.k_lock,
            self.k_state,
            f"{grant.holder}|{grant.token}",
            str(grant.token),
            repr(now),
            repr(cooldown_s),
            str(w.min_replicas),
            s(w.base_min),
            s(w.hold_until),
            s(w.done_at),
        )
        res = res.decode() if isinstance(res, bytes) else str(res)
        if res == "cooldown":  # the script's answer
            raise ActionRejected(f"fleet {self.name} scaled within the cooldown", Refusal.COOLDOWN)
        if res != "ok":
            raise ActionRejected(
                f"fleet {self.name}: write with token {grant.token} refused ({res}): "
                "the lease passed to another agent",
                Refusal.FENCED,
            )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
