"""Redis tier of the prefix cache: blocks spilled from memory, under a key prefix, with a TTL.

Only keys ``<prefix>{<block hash>}`` are ever written or read; nothing else in
the database is touched. The braces are a Redis Cluster hash tag: every key of
one cache entry hashes to the entry's slot, so they live on one master and
one ``UNLINK`` can evict them together (the agent's evict_cache groups keys by
tag), while different entries spread over the masters. On a cluster the tier
talks through ``redis.cluster.RedisCluster``, found by asking the node given
in the URL (``INFO cluster``). Values are safetensors bytes (no pickle). Redis errors
count and read as a miss: the cache tier is an optimisation, never a failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from kcops.worker.cache import KV


def redact(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def encode(kv: KV) -> bytes:
    tensors = {}
    for i, (k, v) in enumerate(kv):
        tensors[f"k{i}"] = k.contiguous()
        tensors[f"v{i}"] = v.contiguous()
    return st_save(tensors)


def decode(raw: bytes) -> KV:
    tensors = st_load(raw)
    layers = len(tensors) // 2
    return [(tensors[f"k{i}"], tensors[f"v{i}"]) for i in range(layers)]


@dataclass
class RedisTier:
    client: Any  # redis.Redis (sync): used from the model thread only
    url: str
    prefix: str = "kcops:kv:"
    ttl_s: int = 3600
    on_transfer: Callable[[float], None] | None = None  # seconds per reload
    clock: Callable[[], float] = time.perf_counter
    stored: int = 0
    loaded: int = 0
    errors: int = 0
    last_error: str | None = field(default=None)

    @classmethod
    def from_url(
        cls, url: str, prefix: str, ttl_s: int, on_transfer: Callable[[float], None] | None = None
    ) -> RedisTier:
        import redis

        client: Any = redis.Redis.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        try:
            clustered = bool(int(client.info("cluster").get("cluster_enabled", 0)))
        except Exception:  # unreachable now: a single node is assumed, errors read as misses
            clustered = False
        if clustered:
            from redis.cluster import RedisCluster

            client.close()
            client = RedisCluster.from_url(url, socket_timeout=2.0, socket_connect_timeout=2.0)
        return cls(client=client, url=url, prefix=prefix, ttl_s=ttl_s, on_transfer=on_transfer)

    def key(self, block: str) -> str:
        """The Redis key of one cache entry: its hash tag is the block hash."""
        return f"{self.prefix}{{{block}}}"

    def store(self, key: str, kv: KV) -> None:
        try:
            self.client.set(self.key(key), encode(kv), ex=max(1, int(self.ttl_s)))
            self.stored += 1
        except Exception as exc:  # redis.RedisError and connection errors: count, carry on
            self._error(exc)

    def load(self, key: str) -> KV | None:
        start = self.clock()
        try:
            raw = self.client.get(self.key(key))
        except Exception as exc:
            self._error(exc)
            return None
        if raw is None:
            return None
        try:
            kv = decode(raw)
        except Exception as exc:  # a corrupt or foreign value: count it, serve a miss
            self._error(exc)
            return None
        self.loaded += 1
        if self.on_transfer is not None:
            self.on_transfer(self.clock() - start)
        return kv

    def _error(self, exc: Exception) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"

    def state(self) -> dict[str, object]:
        return {
            "url": redact(self.url),
            "prefix": self.prefix,
            "ttl_s": self.ttl_s,
            "stored": self.stored,
            "loaded": self.loaded,
            "errors": self.errors,
            "last_error": self.last_error,
        }
