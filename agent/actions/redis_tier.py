"""Eviction in the Redis KV tier: only keys under the configured prefix.

``SCAN MATCH <escaped prefix>*`` finds candidates; every key is checked
again against the prefix before it is touched (a glob can surprise).
Idle time comes from ``OBJECT IDLETIME`` in pipelined batches; keys go with
``UNLINK`` (freed in the background, never blocks Redis). The whole run is
bounded in time: past ``max_seconds`` it stops and reports what it did.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

_GLOB_SPECIAL = "\\*?[]^"


def glob_escape(prefix: str) -> str:
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in prefix)


@dataclass
class RedisEvictReport:
    scanned: int = 0
    evicted: int = 0
    freed_bytes: int = 0
    keys_before: int = 0
    truncated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "scanned": self.scanned,
            "evicted_keys": self.evicted,
            "freed_bytes": self.freed_bytes,
            "keys_before": self.keys_before,
            "keys_after": self.keys_before - self.evicted,
            "truncated": self.truncated,
        }


async def _idle_and_size(
    client: aioredis.Redis, keys: list[bytes]
) -> list[tuple[bytes, float, int]]:
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.object("idletime", k)
        pipe.memory_usage(k)
    res = await pipe.execute(raise_on_error=False)
    out = []
    for i, k in enumerate(keys):
        idle, size = res[2 * i], res[2 * i + 1]
        if idle is None or isinstance(idle, Exception):
            # Gone meanwhile, or IDLETIME unavailable (LFU policy): treat as fresh.
            if isinstance(idle, ResponseError):
                idle = 0
            else:
                continue
        out.append((k, float(idle), int(size) if isinstance(size, int) else 0))
    return out


async def evict_redis(
    client: aioredis.Redis,
    prefix: str,
    policy: str,
    fraction: float,
    *,
    expired_idle_s: float,
    scan_count: int = 500,
    batch: int = 500,
    max_seconds: float = 5.0,
) -> RedisEvictReport:
    """Evict under ``prefix``: ``expired`` (idle >= expired_idle_s), ``lru`` (the
    ``fraction`` most idle keys) or ``all``. Raises redis errors on connection failure."""
    if not prefix:
        raise ValueError("refusing to evict with an empty prefix")
    pre = prefix.encode()
    deadline = time.monotonic() + max_seconds
    report = RedisEvictReport()
    candidates: list[tuple[bytes, float, int]] = []
    pending: list[bytes] = []

    async def flush_pending() -> None:
        if pending:
            candidates.extend(await _idle_and_size(client, pending))
            pending.clear()

    async for key in client.scan_iter(match=glob_escape(prefix) + "*", count=scan_count):
        k = key if isinstance(key, bytes) else str(key).encode()
        if not k.startswith(pre):
            continue
        report.scanned += 1
        pending.append(k)
        if len(pending) >= batch:
            await flush_pending()
        if time.monotonic() > deadline:
            report.truncated = True
            break
    await flush_pending()
    report.keys_before = len(candidates)

    if policy == "all":
        victims = candidates
    elif policy == "expired":
        victims = [c for c in candidates if c[1] >= expired_idle_s]
    elif policy == "lru":
        ordered = sorted(candidates, key=lambda c: c[1], reverse=True)
        victims = ordered[: round(len(ordered) * fraction)]
    else:
        raise ValueError(f"unknown policy {policy!r}")

    for i in range(0, len(victims), batch):
        if time.monotonic() > deadline:
            report.truncated = True
            break
        chunk = victims[i : i + batch]
        names = [c[0] for c in chunk if c[0].startswith(pre)]
        if not names:
            continue
        report.evicted += int(await client.unlink(*names))
        report.freed_bytes += sum(c[2] for c in chunk)
    return report
