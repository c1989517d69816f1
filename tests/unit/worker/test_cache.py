"""Prefix cache: chained block keys, hits in tokens, LRU under a budget, spill, evict policies."""

from __future__ import annotations

import psutil
import pytest
import torch

from kcops.worker.cache import KV, PrefixCache, block_keys, kv_nbytes, release_freed_memory
from kcops.worker.redis_tier import decode, encode, redact


def kv_for(n_tokens: int, layers: int = 2, fill: float = 1.0) -> KV:
    return [
        (torch.full((2, n_tokens, 4), fill), torch.full((2, n_tokens, 4), -fill))
        for _ in range(layers)
    ]


BLOCK_BYTES = kv_nbytes(kv_for(4))


def test_block_keys_chain_and_namespace() -> None:
    a = block_keys(list(range(10)), "m|dense", 4)
    assert len(a) == 2  # only full blocks
    b = block_keys([99, *range(1, 10)], "m|dense", 4)
    assert a[0] != b[0] and a[1] != b[1]  # a key names the whole prefix
    assert block_keys(list(range(10)), "m|topn", 4) != a


def test_lookup_counts_tokens_and_leaves_one_token_uncached() -> None:
    c = PrefixCache(budget_bytes=10**9, block_size=4)
    tokens = list(range(12))
    assert c.lookup(tokens, "ns", now=0) == (0, [])
    assert c.insert(tokens, "ns", kv_for(12), now=0) == 3
    n, kv = c.lookup(tokens, "ns", now=1)
    assert n == 8  # 12 tokens: the last block is kept back so one token is computed
    assert kv[0][0].shape == (2, 8, 4)
    assert (c.stats.queries, c.stats.hits) == (24, 8)
    n, _ = c.lookup([*tokens, 5], "ns", now=2)
    assert n == 12


def test_lru_eviction_under_budget_spills_oldest() -> None:
    spilled: dict[str, KV] = {}
    c = PrefixCache(budget_bytes=2 * BLOCK_BYTES, block_size=4, spiller=spilled.__setitem__)
    c.insert([1, 2, 3, 4], "ns", kv_for(4), now=0)
    c.insert([5, 6, 7, 8], "ns", kv_for(4), now=1)
    c.lookup([1, 2, 3, 4, 0], "ns", now=2)  # touch the first: the second is now LRU
    c.insert([9, 9, 9, 9], "ns", kv_for(4), now=3)
    assert c.blocks == 2 and c.bytes <= c.budget_bytes
    assert list(spilled) == block_keys([5, 6, 7, 8], "ns", 4)
    assert c.usage_ratio == pytest.approx(1.0)


def test_loader_brings_spilled_blocks_back() -> None:
    store: dict[str, KV] = {}
    c = PrefixCache(
        budget_bytes=BLOCK_BYTES, block_size=4, spiller=store.__setitem__, loader=store.get
    )
    c.insert([1, 2, 3, 4], "ns", kv_for(4, fill=3.0), now=0)
    c.insert([5, 6, 7, 8], "ns", kv_for(4), now=1)  # spills the first
    n, kv = c.lookup([1, 2, 3, 4, 0], "ns", now=2)
    assert n == 4 and c.stats.redis_hits == 1 and float(kv[0][0].max()) == 3.0


def test_evict_policies() -> None:
    c = PrefixCache(budget_bytes=10**9, block_size=4)
    for i in range(4):
        c.insert([i] * 4, "ns", kv_for(4), now=float(i))
    assert c.evict("lru", fraction=0.5) == (2, 2 * BLOCK_BYTES)
    assert c.evict("expired", ttl_s=10, now=12.5) == (1, BLOCK_BYTES)  # block stored at t=2
    assert c.evict("all") == (1, BLOCK_BYTES)
    assert c.blocks == 0 and c.bytes == 0
    with pytest.raises(ValueError, match="lru, expired or all"):
        c.evict("random")


def test_set_budget_drops_least_recently_used_blocks_without_spilling() -> None:
    spilled: dict[str, KV] = {}
    c = PrefixCache(budget_bytes=10**9, block_size=4, spiller=spilled.__setitem__)
    for i in range(4):
        c.insert([i] * 4, "ns", kv_for(4), now=float(i))
    c.lookup([0, 0, 0, 0, 1], "ns", now=5)  # block 0 is now the most recently used
    assert c.set_budget(2 * BLOCK_BYTES) == (2, 2 * BLOCK_BYTES)
    assert c.blocks == 2 and c.budget_bytes == 2 * BLOCK_BYTES and not spilled
    assert c.lookup([0, 0, 0, 0, 1], "ns", now=6)[0] == 4  # kept
    assert c.lookup([1, 1, 1, 1, 1], "ns", now=6)[0] == 0  # dropped
    assert c.set_budget(10**9) == (0, 0)
    with pytest.raises(ValueError, match="> 0"):
        c.set_budget(0)


def test_an_eviction_gives_the_memory_back_to_the_os() -> None:
    # Blocks shaped as SmolLM2's (3 KV heads, 16 tokens, head dim 64, 30 layers): small
    # tensors in malloc's heaps, whose freed pages stay resident until trimmed.
    proc = psutil.Process()
    blocks = 170
    c = PrefixCache(budget_bytes=10**10, block_size=16)
    tokens = list(range(16 * blocks))
    source = [(torch.rand(3, len(tokens), 64), torch.rand(3, len(tokens), 64)) for _ in range(30)]
    c.insert(tokens, "ns", source, now=0)
    del source
    release_freed_memory()
    full = proc.memory_info().rss
    _, freed = c.evict("lru", fraction=0.5)
    assert freed > 50 * 2**20
    if not release_freed_memory():
        pytest.skip("no malloc_trim here (not glibc)")
    after = proc.memory_info().rss
    assert full - after > 0.6 * freed, (full, after, freed)


def test_redis_encoding_roundtrip_and_redaction() -> None:
    kv = kv_for(4, layers=3, fill=2.0)
    back = decode(encode(kv))
    assert len(back) == 3 and all(torch.equal(a[0], b[0]) for a, b in zip(kv, back, strict=True))
    assert redact("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert redact("redis://h:1/0") == "redis://h:1/0"
