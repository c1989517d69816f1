"""Prefix cache: per-block KV tensors keyed by chained token-block hashes, LRU under a budget.

A block is ``block_size`` prompt tokens. Its key hashes the previous block's key
and its own tokens (plus a namespace: model and attention policy, since KV
computed under top-N attention differs from dense KV), so a key names a whole
prefix. Memory-tier evictions under budget pressure spill to the optional
Redis tier; explicit evictions (admin, reset) drop.

Counters follow vLLM: ``queries`` and ``hits`` count prompt tokens.
Time is passed in (``now``, seconds) wherever logic depends on it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

BLOCK_SIZE = 16

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (keys, values), each (Hkv, T, D)


@dataclass
class Block:
    key: str
    kv: KV
    nbytes: int
    created_s: float
    last_used_s: float


@dataclass
class CacheStats:
    queries: int = 0
    hits: int = 0
    redis_hits: int = 0
    evicted: int = 0
    spilled: int = 0


def block_keys(tokens: Sequence[int], namespace: str, block_size: int = BLOCK_SIZE) -> list[str]:
    """Chained hashes of the full blocks of ``tokens``."""
    keys: list[str] = []
    prev = hashlib.sha256(namespace.encode()).hexdigest()[:32]
    for start in range(0, len(tokens) - block_size + 1, block_size):
        chunk = ",".join(str(t) for t in tokens[start : start + block_size])
        prev = hashlib.sha256(f"{prev}|{chunk}".encode()).hexdigest()[:32]
        keys.append(prev)
    return keys


def kv_nbytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        fn = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to call
        return None
    if fn is not None:
        fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def release_freed_memory() -> bool:
    """Hand the heap pages that freed blocks leave back to the OS; True when it could.

    A block's tensors are small (one block of one layer), so they live in
    malloc's heaps, which keep freed pages: without this an eviction frees
    nothing the device (the process's resident memory) can see. glibc only.
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


# A second tier: ``load(key)`` returns KV or None; ``store(key, kv)`` keeps a spilled block.
Loader = Callable[[str], KV | None]
Spiller = Callable[[str, KV], None]


@dataclass
class PrefixCache:
    budget_bytes: int
    block_size: int = BLOCK_SIZE
    loader: Loader | None = None
    spiller: Spiller | None = None
    stats: CacheStats = field(default_factory=CacheStats)
    _blocks: OrderedDict[str, Block] = field(default_factory=OrderedDict)
    _bytes: int = 0

    @property
    def blocks(self) -> int:
        return len(self._blocks)

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def usage_ratio(self) -> float:
        return self._bytes / self.budget_bytes if self.budget_bytes > 0 else 0.0

    def lookup(self, tokens: Sequence[int], namespace: str, now: float) -> tuple[int, KV]:
        """Longest cached prefix of ``tokens``: ``(n_tokens, kv concatenated per layer)``.

        At least one token is always left uncached (the model needs one to compute
        logits). Counts ``len(tokens)`` queries and ``n_tokens`` hits."""
        keys = block_keys(tokens, namespace, self.block_size)
        max_blocks = (len(tokens) - 1) // self.block_size
        found: list[Block] = []
        for key in keys[:max_blocks]:
            block = self._blocks.get(key)
            if block is None and self.loader is not None:
                kv = self.loader(key)
                if kv is not None:
                    block = self._put(key, kv, now)
                    self.stats.redis_hits += 1
            if block is None:
                break
            block.last_used_s = now
            self._blocks.move_to_end(key)
            found.append(block)
        n = len(found) * self.block_size
        self.stats.queries += len(tokens)
        self.stats.hits += n
        if not found:
            return 0, []
        layers = len(found[0].kv)
        kv = [
            (
                torch.cat([b.kv[i][0] for b in found], dim=-2),
                torch.cat([b.kv[i][1] for b in found], dim=-2),
            )
            for i in range(layers)
        ]
        return n, kv

    def insert(self, tokens: Sequence[int], namespace: str, kv: KV, now: float) -> int:
        """Store the full blocks of ``tokens`` from ``kv`` (per layer (Hkv, T, D), T ≥ len).

        Returns how many new blocks were stored."""
        added = 0
        for i, key in enumerate(block_keys(tokens, namespace, self.block_size)):
            if key in self._blocks:
                self._blocks[key].last_used_s = now
                self._blocks.move_to_end(key)
                continue
            s = slice(i * self.block_size, (i + 1) * self.block_size)
            part = [(k[:, s].clone(), v[:, s].clone()) for k, v in kv]
            self._put(key, part, now)
            added += 1
        return added

    def _put(self, key: str, kv: KV, now: float) -> Block:
        block = Block(key, kv, kv_nbytes(kv), now, now)
        self._blocks[key] = block
        self._bytes += block.nbytes
        while self._bytes > self.budget_bytes and len(self._blocks) > 1:
            old_key, old = self._blocks.popitem(last=False)
            self._bytes -= old.nbytes
            self.stats.evicted += 1
            if self.spiller is not None:
                self.spiller(old_key, old.kv)
                self.stats.spilled += 1
        return block

    def _drop(self, keys: Sequence[str]) -> tuple[int, int]:
        freed = 0
        for key in keys:
            block = self._blocks.pop(key)
            freed += block.nbytes
        self._bytes -= freed
        self.stats.evicted += len(keys)
        return len(keys), freed

    def set_budget(self, budget_bytes: int) -> tuple[int, int]:
        """A new memory budget (bytes, > 0). Past it, least recently used blocks are
        dropped, not spilled, as an explicit eviction is. Returns ``(blocks, bytes)`` dropped."""
        if budget_bytes <= 0:
            raise ValueError(f"budget_bytes must be > 0, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        over: list[str] = []
        left = self._bytes
        for key, block in self._blocks.items():  # least recently used first
            if left <= budget_bytes:
                break
            over.append(key)
            left -= block.nbytes
        return self._drop(over)

    def evict(
        self, policy: str, *, fraction: float = 1.0, ttl_s: float = 0.0, now: float = 0.0
    ) -> tuple[int, int]:
        """Drop blocks (no spill): ``all``; ``lru``: the least recently used ``fraction``;
        ``expired``: stored more than ``ttl_s`` ago (a TTL, like the Redis tier's).
        Returns ``(blocks, bytes)`` freed."""
        if policy == "all":
            return self._drop(list(self._blocks))
        if policy == "lru":
            count = round(len(self._blocks) * max(0.0, min(1.0, fraction)))
            return self._drop(list(self._blocks)[:count])
        if policy == "expired":
            return self._drop([k for k, b in self._blocks.items() if now - b.created_s > ttl_s])
        raise ValueError(f"unknown eviction policy {policy!r}: use lru, expired or all")
