"""Evicting 10,000 keys under the KV prefix: one redis-server vs a three-master cluster.

    .venv/bin/python bench/redis_evict.py [--keys 10000] [--runs 5] [--policy all|expired|lru]

Starts a real redis-server and a real six-node Redis Cluster (three masters) on
127.0.0.1, fills each with ``--keys`` keys under the prefix (one hash-tagged
key per entry, 256-byte values, as the worker writes them) plus as many keys
outside it, and times ``evict_redis`` with the agent's defaults (SCAN COUNT
500, batches of 500). Median of ``--runs`` fills and evictions. Goal: <= 100
ms on one node.

``--policy``: ``all`` unlinks inside one script per SCAN step (no key leaves
Redis); ``expired`` (with ``expired_idle_s`` 0, so every key qualifies) and
``lru`` (``--fraction``, default 1.0) take the other path, the one the alert
ladders use: each SCAN step returns its keys with idle time and size, the
agent ranks them and sends them back in UNLINK batches.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis
import redis.asyncio as aioredis
from redis.cluster import RedisCluster

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kcops.agent.actions.redis_tier import evict_redis  # noqa: E402
from tests.redis_cluster import redis_cluster  # noqa: E402
from tests.services import redis_server  # noqa: E402

PREFIX = "kcops:kv:"


def fill(client: redis.Redis | RedisCluster, keys: int) -> None:
    value = b"x" * 256
    for start in range(0, keys, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(keys, start + 1000)):
            pipe.set(f"{PREFIX}{{blk{i:06d}}}", value)
            pipe.set(f"session:{i}", b"keep")
        pipe.execute()


def clear(client: redis.Redis | RedisCluster) -> None:
    """Start each run from an empty prefix (lru below 1.0 leaves keys behind)."""
    if isinstance(client, RedisCluster):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        client.flushall()


def server_cpu_s(client: redis.Redis | RedisCluster) -> float:
    """CPU seconds the Redis server(s) used so far (all masters on a cluster)."""
    if isinstance(client, RedisCluster):
        infos = client.info("cpu", target_nodes=RedisCluster.PRIMARIES)
        return sum(float(i["used_cpu_sys"]) + float(i["used_cpu_user"]) for i in infos.values())
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def time_evict(
    url: str, keys: int, scan_count: int, policy: str, fraction: float
) -> tuple[float, float]:
    """(wall seconds, client CPU seconds) of one eviction under ``policy``."""

    async def main() -> tuple[float, float]:
        client = aioredis.from_url(url)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            rep = await evict_redis(
                client,
                PREFIX,
                policy,
                fraction,
                expired_idle_s=0,
                scan_count=scan_count,
                max_seconds=60,
            )
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
        finally:
            await client.aclose()
        want = keys if policy != "lru" else round(keys * fraction)
        # lru rounds per master on a cluster: allow one entry per master either way
        if abs(rep.evicted - want) > 3 or rep.failed_nodes:
            raise RuntimeError(f"evicted {rep.evicted} of {want}: {rep.failed_nodes}")
        return dt, dc

    return asyncio.run(main())


def measure(
    url: str, client: redis.Redis | RedisCluster, keys: int, runs: int, args: argparse.Namespace
) -> tuple[float, float]:
    """Median wall seconds, and median CPU seconds (client + Redis servers)."""
    walls, cpus = [], []
    for _ in range(runs):
        clear(client)
        fill(client, keys)
        s0 = server_cpu_s(client)
        wall, cpu = time_evict(url, keys, args.scan_count, args.policy, args.fraction)
        walls.append(wall)
        cpus.append(cpu + server_cpu_s(client) - s0)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument(
        "--scan-count", type=int, default=500, help="SCAN COUNT (actions.evict.scan_count)"
    )
    ap.add_argument("--policy", choices=("all", "expired", "lru"), default="all")
    ap.add_argument(
        "--fraction", type=float, default=1.0, help="lru: share of the entries (0 < f <= 1)"
    )
    args = ap.parse_args()
    if not 0 < args.fraction <= 1:
        ap.error(f"--fraction {args.fraction}: must be in (0, 1]")
    with tempfile.TemporaryDirectory() as tmp:
        with redis_server(Path(tmp)) as url:
            single = measure(url, redis.Redis.from_url(url), args.keys, args.runs, args)
        with redis_cluster(Path(tmp) / "cluster") as c:
            rc = RedisCluster.from_url(c.url())
            cluster = measure(c.url(), rc, args.keys, args.runs, args)
            rc.close()
    print(f"keys under the prefix {args.keys} (+{args.keys} outside it), median of {args.runs}")
    policy = args.policy + (f" {args.fraction:g}" if args.policy == "lru" else "")
    print(f"policy                {policy} (expired_idle_s 0)")
    print(f"SCAN COUNT            {args.scan_count}")
    print(f"load average (1 min)  {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print("                      wall ms   CPU ms (client + redis)")
    print(
        f"one node              {single[0] * 1000:7.1f}   {single[1] * 1000:7.1f}   goal <= 100 ms"
    )
    print(f"cluster, 3 masters    {cluster[0] * 1000:7.1f}   {cluster[1] * 1000:7.1f}")
    print(f"cluster / one node    {cluster[0] / single[0]:7.2f}   {cluster[1] / single[1]:7.2f}")


if __name__ == "__main__":
    main()
