"""Eviction in the Redis KV tier: only keys under the configured prefix, on one
node or on every master of a Redis Cluster.

``SCAN MATCH <escaped prefix>*`` finds candidates on each node; every key is
checked again against the prefix before it is touched (a glob can surprise).
The worker writes one key per cache block, ``<prefix>{<block hash>}``
(kcops.worker.redis_tier); keys that share a hash tag (several keys of one
entry, as other writers lay them out) live in one slot and are one entry: the
unit of eviction, unlinked together, ranked by LRU by their most recently
used key.
Idle time comes from ``OBJECT IDLETIME`` in pipelined batches; keys go with
``UNLINK`` (freed in the background, never blocks Redis). The whole run is
bounded in time: past ``max_seconds`` it stops and reports what it did.

On a cluster the seed node's ``CLUSTER NODES`` names the masters; each is
walked with its own connection. A master that fails mid-run (connection
refused, a failover's ``MOVED``/``CLUSTERDOWN``) is reported under
``failed_nodes`` with what it answered, and the other masters carry on. What
a failed master had evicted before it failed still counts (``evicted_keys``,
and its entry of ``node_reports`` with ``complete: false``): those keys are gone.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import RedisError, ResponseError

_GLOB_SPECIAL = "\\*?[]^"


# A test seam: awaited after each step of a node's walk with (node, "scan" | "unlink").
StepHook = Callable[[str, str], Awaitable[None]]


async def _no_hook(node: str, phase: str) -> None:
    return None


def glob_escape(prefix: str) -> str:
    return "".join("\\" + c if c in _GLOB_SPECIAL else c for c in prefix)


def entry_of(key: bytes) -> bytes:
    """The entry a key belongs to: its hash tag's content, else the key itself."""
    start = key.find(b"{")
    if start >= 0:
        end = key.find(b"}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


@dataclass
class RedisEvictReport:
    scanned: int = 0
    evicted: int = 0
    freed_bytes: int = 0
    keys_before: int = 0
    truncated: bool = False
    nodes: list[str] = field(default_factory=list)
    failed_nodes: dict[str, str] = field(default_factory=dict)
    # per cluster master: what it did, complete or up to its failure
    node_reports: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, other: RedisEvictReport) -> None:
        self.scanned += other.scanned
        self.evicted += other.evicted
        self.freed_bytes += other.freed_bytes
        self.keys_before += other.keys_before
        self.truncated = self.truncated or other.truncated

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scanned": self.scanned,
            "evicted_keys": self.evicted,
            "freed_bytes": self.freed_bytes,
            "keys_before": self.keys_before,
            "keys_after": self.keys_before - self.evicted,
            "truncated": self.truncated,
        }
        if self.nodes:
            out["nodes"] = list(self.nodes)
            out["failed_nodes"] = dict(self.failed_nodes)
            out["node_reports"] = {k: dict(v) for k, v in self.node_reports.items()}
        return out

    def summary(self, complete: bool) -> dict[str, Any]:
        return {
            "evicted_keys": self.evicted,
            "scanned": self.scanned,
            "freed_bytes": self.freed_bytes,
            "complete": complete,
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
        if isinstance(idle, ResponseError) and str(idle).startswith(("MOVED", "ASK")):
            raise idle  # the slot moved (failover): this node's walk stops here
        if idle is None or isinstance(idle, Exception):
            # Gone meanwhile, or IDLETIME unavailable (LFU policy): treat as fresh.
            if isinstance(idle, ResponseError):
                idle = 0
            else:
                continue
        out.append((k, float(idle), int(size) if isinstance(size, int) else 0))
    return out


# Server-side batches: one EVAL answers for a whole batch of keys instead of
# one reply per key (parsing 20,000 pipelined replies costs seconds in Python).
# allow-cross-slot-keys (Redis >= 7.0) lets one script touch keys of many
# slots on a cluster node; every key still belongs to the node that runs it.
_PROBE = """#!lua flags=allow-cross-slot-keys,no-writes
local out = {}
for i, k in ipairs(KEYS) do
  local ok, idle = pcall(redis.call, 'OBJECT', 'IDLETIME', k)
  if not ok then idle = 0 end
  local size = redis.call('MEMORY', 'USAGE', k)
  if size then
    out[#out + 1] = idle or 0
    out[#out + 1] = size
  else
    out[#out + 1] = -1
    out[#out + 1] = 0
  end
end
return out
"""
# The keys come as arguments, not KEYS: a cluster refuses declared keys of
# several slots (CROSSSLOT) even with the flag, which only covers keys a
# script touches. All of them are this node's: they came from its own SCAN.
_UNLINK = """#!lua flags=allow-cross-slot-keys
local n = 0
local plen = string.len(ARGV[1])
for i = 2, #ARGV do
  local k = ARGV[i]
  if string.sub(k, 1, plen) == ARGV[1] then n = n + redis.call('UNLINK', k) end
end
return n
"""

# One SCAN step and the idle time and size of every key it matched, answered
# as ONE bulk string: "<cursor>\n" then per key "<len> <idle> <size> <key>".
_SCAN_PROBE = """#!lua flags=allow-cross-slot-keys,no-writes
local res = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local plen = string.len(ARGV[4])
local parts = {res[1], '\\n'}
for _, k in ipairs(res[2]) do
  if string.sub(k, 1, plen) == ARGV[4] then
    local ok, idle = pcall(redis.call, 'OBJECT', 'IDLETIME', k)
    if not ok or not idle then idle = 0 end
    local size = redis.call('MEMORY', 'USAGE', k)
    if size then
      parts[#parts + 1] = string.len(k) .. ' ' .. idle .. ' ' .. size .. ' ' .. k
    end
  end
end
return table.concat(parts)
"""

# Policy "all": one SCAN step that unlinks what it matched under the prefix and
# answers "<cursor> <matched> <unlinked> <bytes>": no key crosses the wire.
_SCAN_UNLINK = """#!lua flags=allow-cross-slot-keys
local res = redis.call('SCAN', ARGV[1], 'MATCH', ARGV[2], 'COUNT', ARGV[3])
local plen = string.len(ARGV[4])
local matched, n, bytes = 0, 0, 0
for _, k in ipairs(res[2]) do
  if string.sub(k, 1, plen) == ARGV[4] then
    matched = matched + 1
    bytes = bytes + (redis.call('MEMORY', 'USAGE', k) or 0)
    n = n + redis.call('UNLINK', k)
  end
end
return res[1] .. ' ' .. matched .. ' ' .. n .. ' ' .. bytes
"""


async def _scan_unlink_all(
    client: aioredis.Redis,
    prefix: str,
    scan_count: int,
    deadline: float,
    report: RedisEvictReport,
    step: Callable[[str], Awaitable[None]],
) -> RedisEvictReport:
    """Policy "all" in the node itself, counted into ``report`` step by step (so a
    failure part-way leaves what was done in it). Raises ResponseError on Redis < 7.0."""
    cursor = 0
    pattern = glob_escape(prefix) + "*"
    while True:
        raw = await client.eval(_SCAN_UNLINK, 0, cursor, pattern, scan_count, prefix)
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        c, matched, n, size = (int(x) for x in text.split())
        cursor = c
        report.scanned += matched
        report.keys_before += matched
        report.evicted += n
        report.freed_bytes += size
        await step("scan")
        if cursor == 0:
            return report
        if time.monotonic() > deadline:
            report.truncated = True
            return report


def parse_scan_probe(raw: bytes) -> tuple[int, list[tuple[bytes, float, int]]]:
    """Decode _SCAN_PROBE's answer: (next cursor, [(key, idle_s, bytes)])."""
    nl = raw.index(b"\n")
    cursor = int(raw[:nl])
    out: list[tuple[bytes, float, int]] = []
    i = nl + 1
    while i < len(raw):
        a = raw.index(b" ", i)
        b = raw.index(b" ", a + 1)
        c = raw.index(b" ", b + 1)
        n = int(raw[i:a])
        out.append((raw[c + 1 : c + 1 + n], float(raw[a + 1 : b]), int(raw[b + 1 : c])))
        i = c + 1 + n
    return cursor, out


async def _scan_probe_all(
    client: aioredis.Redis,
    prefix: str,
    scan_count: int,
    deadline: float,
    step: Callable[[str], Awaitable[None]],
) -> tuple[list[tuple[bytes, float, int]], bool]:
    """Every key under ``prefix`` on this node with its idle time and size, through
    the script; (candidates, truncated). Raises ResponseError where scripts with
    flags are unknown (Redis < 7.0)."""
    cursor = 0
    out: list[tuple[bytes, float, int]] = []
    pattern = glob_escape(prefix) + "*"
    while True:
        raw = await client.eval(_SCAN_PROBE, 0, cursor, pattern, scan_count, prefix)
        cursor, got = parse_scan_probe(raw if isinstance(raw, bytes) else str(raw).encode())
        out.extend(got)
        await step("scan")
        if cursor == 0:
            return out, False
        if time.monotonic() > deadline:
            return out, True


class _Scripts:
    """Per node: whether it runs the batch scripts (Redis >= 7.0) or needs the pipelines."""

    def __init__(self, client: aioredis.Redis) -> None:
        self.client = client
        self.ok: bool | None = None

    async def probe(self, keys: list[bytes]) -> list[tuple[bytes, float, int]]:
        if self.ok is not False:
            try:
                flat = await self.client.eval(_PROBE, len(keys), *keys)
                self.ok = True
                return [
                    (k, float(flat[2 * i]), int(flat[2 * i + 1]))
                    for i, k in enumerate(keys)
                    if int(flat[2 * i]) >= 0
                ]
            except ResponseError as exc:
                if self.ok or str(exc).startswith(("MOVED", "ASK", "CROSSSLOT", "CLUSTERDOWN")):
                    raise
                self.ok = False  # an older Redis: no script flags
        return await _idle_and_size(self.client, keys)

    async def unlink(self, keys: list[bytes], prefix: bytes, by_slot: bool) -> int:
        if self.ok:
            return int(await self.client.eval(_UNLINK, 0, prefix, *keys))
        return await _unlink(self.client, keys, by_slot)


# An entry: (entry id, idle seconds of its most recently used key, keys, bytes)
Entry = tuple[bytes, float, list[bytes], int]


def _entries(candidates: list[tuple[bytes, float, int]]) -> list[Entry]:
    groups: dict[bytes, list[Any]] = {}
    for key, idle, size in candidates:
        eid = entry_of(key) if b"{" in key else key
        g = groups.get(eid)
        if g is None:
            groups[eid] = [idle, [key], size]
        else:
            g[0] = min(g[0], idle)
            g[1].append(key)
            g[2] += size
    return [(eid, g[0], g[1], g[2]) for eid, g in groups.items()]


def _choose(
    entries: list[Entry], policy: str, fraction: float, expired_idle_s: float
) -> list[Entry]:
    if policy == "all":
        return entries
    if policy == "expired":
        return [e for e in entries if e[1] >= expired_idle_s]
    if policy == "lru":
        ordered = sorted(entries, key=lambda e: e[1], reverse=True)
        return ordered[: round(len(ordered) * fraction)]
    raise ValueError(f"unknown policy {policy!r}; allowed: all, expired, lru")


async def _unlink(client: aioredis.Redis, names: list[bytes], by_slot: bool) -> int:
    """UNLINK ``names``; on a cluster node, one command per slot (multi-key commands
    must stay within a slot there)."""
    if not by_slot:
        return int(await client.unlink(*names))
    slots: dict[int, list[bytes]] = defaultdict(list)
    for k in names:
        slots[key_slot(k)].append(k)
    pipe = client.pipeline(transaction=False)
    for keys in slots.values():
        pipe.unlink(*keys)
    res = await pipe.execute(raise_on_error=False)
    for r in res:
        if isinstance(r, Exception):
            raise r
    return sum(int(r) for r in res)


async def evict_node(
    client: aioredis.Redis,
    prefix: str,
    policy: str,
    fraction: float,
    *,
    expired_idle_s: float,
    scan_count: int = 500,
    batch: int = 500,
    deadline: float,
    cluster: bool = False,
    report: RedisEvictReport | None = None,
    step: Callable[[str], Awaitable[None]] | None = None,
) -> RedisEvictReport:
    """Evict under ``prefix`` on one node, counting into ``report`` as it goes (a
    new one if None). Raises redis errors on connection failure; what was evicted
    before is then in ``report``."""
    report = RedisEvictReport() if report is None else report
    hook = step or functools.partial(_no_hook, "")
    pre = prefix.encode()
    if policy == "all":
        try:
            return await _scan_unlink_all(client, prefix, scan_count, deadline, report, hook)
        except ResponseError as exc:
            if str(exc).startswith(("MOVED", "ASK", "CROSSSLOT", "CLUSTERDOWN")):
                raise
            # Redis < 7.0: the general path below
    scripts = _Scripts(client)
    candidates: list[tuple[bytes, float, int]] = []
    pending: list[bytes] = []

    async def flush_pending() -> None:
        if pending:
            candidates.extend(await scripts.probe(pending))
            pending.clear()

    fast = True
    try:
        candidates, report.truncated = await _scan_probe_all(
            client, prefix, scan_count, deadline, hook
        )
        scripts.ok = True
    except ResponseError as exc:
        if str(exc).startswith(("MOVED", "ASK", "CROSSSLOT", "CLUSTERDOWN")):
            raise
        fast, scripts.ok = False, False  # Redis < 7.0: SCAN and pipelines from here
    if not fast:
        async for key in client.scan_iter(match=glob_escape(prefix) + "*", count=scan_count):
            k = key if isinstance(key, bytes) else str(key).encode()
            if not k.startswith(pre):
                continue
            pending.append(k)
            if len(pending) >= batch:
                await flush_pending()
            if time.monotonic() > deadline:
                report.truncated = True
                break
        await flush_pending()
    # every key is checked against the prefix again, whichever path found it
    candidates = [c for c in candidates if c[0].startswith(pre)]
    report.scanned = len(candidates)
    report.keys_before = len(candidates)

    victims = _choose(_entries(candidates), policy, fraction, expired_idle_s)
    chunk: list[bytes] = []
    freed = 0
    for i, (_, _, keys, size) in enumerate(victims):
        chunk.extend(k for k in keys if k.startswith(pre))
        freed += size
        if len(chunk) >= batch or i == len(victims) - 1:
            if time.monotonic() > deadline:
                report.truncated = True
                break
            report.evicted += await scripts.unlink(chunk, pre, cluster)
            report.freed_bytes += freed
            chunk, freed = [], 0
            await hook("unlink")
    return report


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
    kw: dict[str, Any] = {
        "expired_idle_s": expired_idle_s,
        "scan_count": scan_count,
        "batch": batch,
        "deadline": deadline,
    }
    hook = on_step or _no_hook
    masters = await cluster_masters(client)
    if masters is None:
        return await evict_node(
            client, prefix, policy, fraction, step=functools.partial(hook, ""), **kw
        )
    report = RedisEvictReport()
    for host, port in masters:
        name = f"{host}:{port}"
        report.nodes.append(name)
        node = node_client(client, host, port)
        part = RedisEvictReport()
        try:
            await evict_node(
                node,
                prefix,
                policy,
                fraction,
                cluster=True,
                report=part,
                step=functools.partial(hook, name),
                **kw,
            )
        except (RedisError, OSError) as exc:
            report.failed_nodes[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        finally:
            await node.aclose()
            report.add(part)
            report.node_reports[name] = part.summary(name not in report.failed_nodes)
    return report
