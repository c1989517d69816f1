"""The KV tier on a real three-master Redis Cluster (six local redis-server nodes).

The worker's tier stores and reloads entries through the cluster; evict_cache's
Redis part walks every master, never leaves the prefix, evicts an entry's
co-located keys together, and when a master dies in the middle of its own walk
reports the node it could not finish, counts what it had evicted there, and
loses nothing outside the prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis
from redis.cluster import RedisCluster

from kcops.agent.actions.redis_tier import evict_redis
from tests.redis_cluster import Cluster, redis_cluster

pytestmark = pytest.mark.slow

PREFIX = "kcops:kv:"
OTHERS = [f"session:{i}" for i in range(60)] + [f"kcops:kvx:{i}" for i in range(30)]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with redis_cluster(tmp_path) as c:
        yield c


def seed(c: Cluster, entries: int) -> RedisCluster:
    rc = RedisCluster.from_url(c.url())
    for k in OTHERS:
        rc.set(k, b"keep")
    for i in range(entries):
        # one entry: two keys sharing its hash tag, so they sit in one slot
        rc.set(f"{PREFIX}{{e{i}}}:kv", b"x" * 128)
        rc.set(f"{PREFIX}{{e{i}}}:meta", b"m")
    return rc


def evict(url: str, policy: str = "all", fraction: float = 1.0) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        client = aioredis.from_url(url)
        try:
            rep = await evict_redis(client, PREFIX, policy, fraction, expired_idle_s=0, batch=64)
        finally:
            await client.aclose()
        return rep.to_json()

    return asyncio.run(main())


def prefix_keys(rc: RedisCluster) -> set[bytes]:
    return set(rc.scan_iter(match=PREFIX + "*", target_nodes=RedisCluster.PRIMARIES))


def test_worker_tier_hits_survive_on_the_cluster(cluster: Cluster) -> None:
    torch = pytest.importorskip("torch")
    from kcops.worker.redis_tier import RedisTier

    tier = RedisTier.from_url(cluster.url(), PREFIX, ttl_s=600)
    assert isinstance(tier.client, RedisCluster)
    blocks = {
        f"blk{i:03d}": [(torch.full((2, 4, 8), float(i)), torch.full((2, 4, 8), -float(i)))]
        for i in range(40)
    }
    for key, kv in blocks.items():
        tier.store(key, kv)
    for key, kv in blocks.items():
        got = tier.load(key)
        assert got is not None, key
        assert torch.equal(got[0][0], kv[0][0]) and torch.equal(got[0][1], kv[0][1])
    assert tier.errors == 0 and tier.loaded == 40
    # entries spread over the masters (one hash tag per entry, not one per tier)
    holding = [p for p in cluster.masters() if cluster.node(p).dbsize() > 0]
    assert len(holding) == 3


def test_eviction_walks_every_master_and_keeps_everything_else(cluster: Cluster) -> None:
    rc = seed(cluster, 300)
    out = evict(cluster.url())
    assert sorted(int(n.rsplit(":", 1)[1]) for n in out["nodes"]) == cluster.masters()
    assert out["failed_nodes"] == {}
    assert out["evicted_keys"] == 600 and out["keys_after"] == 0
    assert prefix_keys(rc) == set()
    assert all(rc.get(k) == b"keep" for k in OTHERS)


def test_eviction_on_a_tls_cluster_talks_tls_to_every_master(tmp_path: Path) -> None:
    """A ``rediss://`` seed: each master is reached with the seed's TLS settings (the
    walk used to open plain TCP to the masters, and every node failed)."""
    with redis_cluster(tmp_path, tls=True, replicas=0) as c:
        assert c.tls is not None
        url = c.url()
        assert url.startswith("rediss://")
        rc = seed(c, 120)
        out = evict(url)
        assert out["failed_nodes"] == {}, out
        assert sorted(int(n.rsplit(":", 1)[1]) for n in out["nodes"]) == c.masters()
        assert out["evicted_keys"] == 240 and out["keys_after"] == 0
        assert prefix_keys(rc) == set()
        assert all(rc.get(k) == b"keep" for k in OTHERS)
        # the nodes really refuse plain TCP: TLS was needed, not merely allowed
        plain = redis.Redis(port=c.ports[0], socket_timeout=2)
        with contextlib.closing(plain), pytest.raises(redis.RedisError):
            plain.ping()


def test_lru_evicts_whole_entries(cluster: Cluster) -> None:
    rc = seed(cluster, 100)
    out = evict(cluster.url(), "lru", 0.5)
    assert out["failed_nodes"] == {}
    left = prefix_keys(rc)
    entries = {k.split(b"}")[0] for k in left}
    # each entry is either whole or gone: 2 keys per surviving entry
    assert len(left) == 2 * len(entries)
    assert 40 <= len(entries) <= 60  # half of each master's entries, rounded per master
    assert all(rc.get(k) == b"keep" for k in OTHERS)


@pytest.mark.parametrize(
    ("policy", "phase"),
    [("all", "scan"), ("lru", "unlink")],  # killed after its first SCAN / UNLINK batch
)
def test_master_failover_mid_eviction(cluster: Cluster, policy: str, phase: str) -> None:
    rc = seed(cluster, 300)
    masters = cluster.masters()
    for p in masters:  # make sure the replicas hold every write before the failure
        with contextlib.closing(cluster.node(p)) as r:
            assert r.execute_command("WAIT", 1, 5000) >= 1
    victim, seed_port = masters[-1], masters[0]
    name = f"127.0.0.1:{victim}"
    on_victim = cluster.node(victim).dbsize()
    others_on_victim = sum(1 for k in OTHERS if rc.get_node_from_key(k).port == victim)
    killed: list[str] = []

    async def step(node: str, ph: str) -> None:
        # the victim dies inside its own walk, once it has evicted a first batch;
        # WAIT first, so its replica holds those deletions when it takes over
        if node == name and ph == phase and not killed:
            with contextlib.closing(cluster.node(victim)) as r:
                assert r.execute_command("WAIT", 1, 5000) >= 1
            cluster.kill(victim)
            killed.append(ph)

    async def main() -> dict[str, Any]:
        client = aioredis.from_url(cluster.url(seed_port))
        try:
            rep = await evict_redis(
                client, PREFIX, policy, 1.0, expired_idle_s=0, batch=16, scan_count=20,
                on_step=step,
            )  # fmt: skip
        finally:
            await client.aclose()
        return rep.to_json()

    out = asyncio.run(main())
    assert killed == [phase]
    assert list(out["failed_nodes"]) == [name]
    assert out["failed_nodes"][name]  # says what went wrong
    # the keys it evicted before it died are counted, and marked incomplete
    part = out["node_reports"][name]
    assert part["complete"] is False and part["evicted_keys"] > 0
    done = [r for n, r in out["node_reports"].items() if n != name]
    assert all(r["complete"] for r in done) and len(done) == 2
    assert out["evicted_keys"] == part["evicted_keys"] + sum(r["evicted_keys"] for r in done)

    cluster.wait_healthy(masters=3)  # the victim's replica has taken over
    rc.close()
    rc = RedisCluster.from_url(cluster.url(seed_port))
    assert all(rc.get(k) == b"keep" for k in OTHERS)  # nothing outside the prefix lost
    left = prefix_keys(rc)
    # what is left is what the failed master held and had not evicted yet: the
    # report says exactly what is gone
    assert len(left) == on_victim - others_on_victim - part["evicted_keys"]
    assert len(left) == 600 - out["evicted_keys"] > 0
    # a second run on the healed cluster finishes the job
    out2 = evict(cluster.url(seed_port))
    assert out2["failed_nodes"] == {} and out2["evicted_keys"] == len(left)
    assert prefix_keys(rc) == set()
    assert all(rc.get(k) == b"keep" for k in OTHERS)


def test_reference_worker_reloads_spilled_blocks_from_the_cluster(cluster: Cluster) -> None:
    """The real worker (tiny model): blocks pushed out of memory come back as cache hits."""
    torch = pytest.importorskip("torch")
    import httpx

    from kcops.worker.app import Background, WorkerOptions, build
    from kcops.worker.cache import kv_nbytes
    from tests.services import free_port

    torch.set_num_threads(1)
    prefix = "kcops:kv:cluster:"
    rc = RedisCluster.from_url(cluster.url())
    for k in OTHERS:
        rc.set(k, b"keep")
    block = kv_nbytes([(torch.zeros(2, 16, 32), torch.zeros(2, 16, 32))] * 2)
    opts = WorkerOptions(
        model="tiny",
        token="t",
        redis_url=cluster.url(),
        redis_prefix=prefix,
        cache_budget_bytes=6 * block,
        cache_ttl_s=120,
        progress=False,
    )
    state = build(opts)
    with Background(state, "127.0.0.1", free_port()) as bg, httpx.Client(base_url=bg.url) as c:
        a, b = list(range(1000, 1080)), list(range(2000, 2080))  # 5 blocks each
        body = {"max_tokens": 2, "temperature": 0}
        first = c.post("/v1/completions", json={"prompt": a, **body}).json()
        c.post("/v1/completions", json={"prompt": b, **body})  # pushes A's blocks to Redis
        spilled = set(rc.scan_iter(match=prefix + "*", target_nodes=RedisCluster.PRIMARIES))
        assert len(spilled) == 4
        assert all(k.startswith(prefix.encode() + b"{") for k in spilled)  # hash-tagged
        again = c.post("/v1/completions", json={"prompt": a, **body}).json()
        assert again["kcops"]["cached_tokens"] == 64  # served from the cluster
        assert again["choices"][0]["text"] == first["choices"][0]["text"]
        st = c.get("/admin/state").json()
        assert st["cache"]["redis_hits"] == 4 and st["redis"]["errors"] == 0
    assert all(rc.get(k) == b"keep" for k in OTHERS)
