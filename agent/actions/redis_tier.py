"""Eviction in the Redis KV tier: only keys under the configured prefix, on one
node or on every master of a Redis Cluster.

``SCAN MATCH <escaped prefix>*`` finds candidates on each node; every key is
checked again against the prefix before it is touched (a glob can surprise).
Keys that share a hash tag (the worker writes ``<prefix>{<block hash>}``) are one
entry: the unit of eviction, unlinked together, ranked by LRU by their most
recently used key (``OBJECT IDLETIME``, pipelined); ``UNLINK`` never blocks
Redis. Past ``max_seconds`` a run stops and reports what it did.

On a cluster each master named by ``CLUSTER NODES`` is walked with its own
connection. A master that fails mid-run is reported under ``failed_nodes`` and
the others carry on; what it evicted before it failed still counts.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError, ResponseError

from kcops.agent.actions.redis_keys import (
    RedisEvictReport,
    Scripts,
    choose,
    entries,
    glob_escape,
    scan_probe_all,
    scan_unlink_all,
)

# A test seam: awaited after each step of a node's walk with (node, "scan" | "unlink").
StepHook = Callable[[str, str], Awaitable[None]]


async def _no_hook(node: str, phase: str) -> None:
    return None


@dataclass(frozen=True)
class Walk:
    """One eviction's settings, the same on every node it walks."""

    prefix: str
    policy: str
    fraction: float
    expired_idle_s: float
    scan_count: int
    batch: int
    deadline: float  # time.monotonic()

    @property
    def pre(self) -> bytes:
        return self.prefix.encode()


def _moved(exc: ResponseError) -> bool:
    """A cluster redirection or outage: raised to the caller, never a reason to fall back."""
    return str(exc).startswith(("MOVED", "ASK", "CROSSSLOT", "CLUSTERDOWN"))


async def evict_node(
    client: aioredis.Redis,
    w: Walk,
    *,
    cluster: bool = False,
    report: RedisEvictReport | None = None,
    step: Callable[[str], Awaitable[None]] | None = None,
) -> RedisEvictReport:
    """Evict under ``w.prefix`` on one node, counting into ``report`` as it goes (a
    new one if None). Raises redis errors on connection failure; what was evicted
    before is then in ``report``."""
    report = RedisEvictReport() if report is None else report
    hook = step or functools.partial(_no_hook, "")
    if w.policy == "all":
        try:
            return await scan_unlink_all(client, w.prefix, w.scan_count, w.deadline, report, hook)
        except ResponseError as exc:
            if _moved(exc):
                raise
            # Redis < 7.0: the general path below
    scripts = Scripts(client)
    candidates = await _candidates(client, scripts, w, report, hook)
    report.scanned = report.keys_before = len(candidates)
    victims = choose(entries(candidates), w.policy, w.fraction, w.expired_idle_s)
    chunk: list[bytes] = []
    freed = 0
    for i, (_, _, keys, size) in enumerate(victims):
        chunk.extend(k for k in keys if k.startswith(w.pre))
        freed += size
        if len(chunk) >= w.batch or i == len(victims) - 1:
            if time.monotonic() > w.deadline:
                report.truncated = True
                break
            report.evicted += await scripts.unlink(chunk, w.pre, cluster)
            report.freed_bytes += freed
            chunk, freed = [], 0
            await hook("unlink")
    return report


async def _candidates(
    client: aioredis.Redis,
    scripts: Scripts,
    w: Walk,
    report: RedisEvictReport,
    hook: Callable[[str], Awaitable[None]],
) -> list[tuple[bytes, float, int]]:
    """Every key under the prefix with its idle time and size: by the server-side scan
    (Redis 7), else by SCAN and pipelined probes. Each key is checked against the prefix
    again, whichever path found it."""
    try:
        found, report.truncated = await scan_probe_all(
            client, w.prefix, w.scan_count, w.deadline, hook
        )
        scripts.ok = True
        return [c for c in found if c[0].startswith(w.pre)]
    except ResponseError as exc:
        if _moved(exc):
            raise
        scripts.ok = False  # Redis < 7.0: SCAN and pipelines from here
    candidates: list[tuple[bytes, float, int]] = []
    pending: list[bytes] = []
    async for key in client.scan_iter(match=glob_escape(w.prefix) + "*", count=w.scan_count):
        k = key if isinstance(key, bytes) else str(key).encode()
        if not k.startswith(w.pre):
            continue
        pending.append(k)
        if len(pending) >= w.batch:
            candidates += await scripts.probe(pending)
            pending.clear()
        if time.monotonic() > w.deadline:
            report.truncated = True
            break
    if pending:
        candidates += await scripts.probe(pending)
    return [c for c in candidates if c[0].startswith(w.pre)]


async def cluster_masters(client: aioredis.Redis) -> list[tuple[str, int]] | None:
    """The masters of the cluster ``client`` talks to, or None when it is a single node."""
    info = await client.info("cluster")
    if not int(info.get("cluster_enabled", 0)):
        return None
    # redis-py parses CLUSTER NODES into {"host:port": {"flags": ..., "slots": [...]}}
    nodes = await client.execute_command("CLUSTER NODES")
    masters = []
    for addr, node in nodes.items():
        flags = str(node.get("flags", "")).split(",")
        if "master" not in flags or "fail" in flags or not node.get("slots"):
            continue
        host, _, port = str(addr).rpartition(":")
        masters.append((host, int(port)))
    return sorted(masters)


def node_client(seed: aioredis.Redis, host: str, port: int) -> aioredis.Redis:
    """A client of one cluster node, connected as ``seed`` is: its connection class (TLS
    for ``rediss://``) and every setting of it (credentials, certificates, timeouts) but
    the address; at most 2 s to connect and per command unless the seed says."""
    pool = seed.connection_pool
    kw = {k: v for k, v in pool.connection_kwargs.items() if k not in ("host", "port", "path")}
    kw["socket_timeout"] = kw.get("socket_timeout") or 2.0
    kw["socket_connect_timeout"] = kw.get("socket_connect_timeout") or 2.0
    node_pool = aioredis.ConnectionPool(
        connection_class=pool.connection_class, host=host, port=port, **kw
    )
    return aioredis.Redis.from_pool(node_pool)  # owns the pool: aclose() closes it


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
    on_step: StepHook | None = None,
) -> RedisEvictReport:
    """Evict under ``prefix``: ``expired`` (entries idle >= expired_idle_s), ``lru`` (the
    ``fraction`` most idle entries) or ``all``, on a single node or every cluster master.

    A single node's connection failure raises; on a cluster each master's failure is
    reported in ``failed_nodes``, what it evicted before it failed is counted (and in
    its ``node_reports`` entry), and the others are still walked."""
    if not prefix:
        raise ValueError("refusing to evict with an empty prefix")
    deadline = time.monotonic() + max_seconds
    w = Walk(prefix, policy, fraction, expired_idle_s, scan_count, batch, deadline)
    hook = on_step or _no_hook
    masters = await cluster_masters(client)
    if masters is None:
        return await evict_node(client, w, step=functools.partial(hook, ""))
    report = RedisEvictReport()
    for host, port in masters:
        name = f"{host}:{port}"
        report.nodes.append(name)
        node = node_client(client, host, port)
        part = RedisEvictReport()
        try:
            await evict_node(node, w, cluster=True, report=part, step=functools.partial(hook, name))
        except (RedisError, OSError) as exc:
            report.failed_nodes[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            await node.aclose()
            report.add(part)
            report.node_reports[name] = part.summary(name not in report.failed_nodes)
    return report
