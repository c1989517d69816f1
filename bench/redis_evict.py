"""Evicting 10,000 keys under the KV prefix: one redis-server vs a three-master cluster.

    .venv/bin/python bench/redis_evict.py [--keys 10000] [--runs 5]

Starts a real redis-server and a real six-node Redis Cluster (three masters) on
127.0.0.1, fills each with ``--keys`` keys under the prefix (one hash-tagged
key per entry, 256-byte values, as the worker writes them) plus as many keys
outside it, and times ``evict_redis(policy="all")`` with the agent's defaults
(SCAN COUNT 500, batches of 500). Median of ``--runs`` fills and evictions.
Goal: <= 100 ms on one node.
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


def server_cpu_s(client: redis.Redis | RedisCluster) -> float:
    """CPU seconds the Redis server(s) used so far (all masters on a cluster)."""
    if isinstance(client, RedisCluster):
        infos = client.info("cpu", target_nodes=RedisCluster.PRIMARIES)
        return sum(float(i["used_cpu_sys"]) + float(i["used_cpu_user"]) for i in infos.values())
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def time_evict(url: str, keys: int, scan_count: int) -> tuple[float, float]:
    """(wall seconds, client CPU seconds) of one eviction of ``keys`` keys."""

    async def main() -> tuple[float, float]:
        client = aioredis.from_url(url)
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            rep = await evict_redis(
                client, PREFIX, "all", 1.0, expired_idle_s=0, scan_count=scan_count, max_seconds=60
            )
            dt, dc = time.perf_counter() - t0, time.process_time() - c0
        finally:
            await client.aclose()
        if rep.evicted != keys or rep.failed_nodes:
            raise RuntimeError(f"evicted {rep.evicted} of {keys}: {rep.failed_nodes}")
        return dt, dc

    return asyncio.run(main())


def measure(
    url: str, client: redis.Redis | RedisCluster, keys: int, runs: int, scan_count: int
) -> tuple[float, float]:
    """Median wall seconds, and median CPU seconds (client + Redis servers)."""
    walls, cpus = [], []
    for _ in range(runs):
        fill(client, keys)
        s0 = server_cpu_s(client)
        wall, cpu = time_evict(url, keys, scan_count)
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
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with redis_server(Path(tmp)) as url:
            single = measure(url, redis.Redis.from_url(url), args.keys, args.runs, args.scan_count)
        with redis_cluster(Path(tmp) / "cluster") as c:
            rc = RedisCluster.from_url(c.url())
            cluster = measure(c.url(), rc, args.keys, args.runs, args.scan_count)
            rc.close()
    print(f"keys under the prefix {args.keys} (+{args.keys} outside it), median of {args.runs}")
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
