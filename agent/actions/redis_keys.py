"""The Redis KV tier's primitives: which keys are the tier's, their idle time and size,
and their removal, in server-side batches. :mod:`.redis_tier` walks the nodes with them.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from kcops.agent.actions.base import JSONObject

_GLOB_SPECIAL = "\\*?[]^"


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
    node_reports: dict[str, JSONObject] = field(default_factory=dict)

    def add(self, other: RedisEvictReport) -> None:
        self.scanned += other.scanned
        self.evicted += other.evicted
        self.freed_bytes += other.freed_bytes
        self.keys_before += other.keys_before
        self.truncated = self.truncated or other.truncated

    def to_json(self) -> JSONObject:
        out: JSONObject = {
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
            reports: JSONObject = {k: dict(v) for k, v in self.node_reports.items()}
            out["node_reports"] = reports
        return out

    def summary(self, complete: bool) -> JSONObject:
        return {
            "evicted_keys": self.evicted,
            "scanned": self.scanned,
            "freed_bytes": self.freed_bytes,
            "complete": complete,
        }


async def idle_and_size(
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


async def scan_unlink_all(
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


async def scan_probe_all(
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


class Scripts:
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
        return await idle_and_size(self.client, keys)

    async def unlink(self, keys: list[bytes], prefix: bytes, by_slot: bool) -> int:
        if self.ok:
            return int(await self.client.eval(_UNLINK, 0, prefix, *keys))
        return await unlink(self.client, keys, by_slot)


# An entry: (entry id, idle seconds of its most recently used key, keys, bytes)
Entry = tuple[bytes, float, list[bytes], int]


def entries(candidates: list[tuple[bytes, float, int]]) -> list[Entry]:
    groups: dict[bytes, Entry] = {}
    for key, idle, size in candidates:
        eid = entry_of(key) if b"{" in key else key
        g = groups.get(eid)
        if g is None:
            groups[eid] = (eid, idle, [key], size)
        else:
            g[2].append(key)
            groups[eid] = (eid, min(g[1], idle), g[2], g[3] + size)
    return list(groups.values())


def choose(
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


async def unlink(client: aioredis.Redis, names: list[bytes], by_slot: bool) -> int:
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
