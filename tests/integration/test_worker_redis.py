"""Redis KV tier with a real redis-server: spill on memory eviction, reload on a hit."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis
import torch
from prometheus_client.parser import text_string_to_metric_families

from kcops.worker.app import Background, WorkerOptions, build
from kcops.worker.cache import kv_nbytes
from tests.services import free_port

PREFIX = "kcops:kv:test:"


@pytest.fixture
def redis_worker(redis_url: str) -> Iterator[tuple[httpx.Client, redis.Redis]]:
    torch.set_num_threads(1)
    r = redis.Redis.from_url(redis_url)
    r.set("other:key", b"keep me")
    r.set("kcops:kv:other-prefix", b"not mine either")
    # tiny: 2 layers x (k, v) x 2 kv heads x 16 tokens x 32 dims x 4 bytes per block
    block = kv_nbytes([(torch.zeros(2, 16, 32), torch.zeros(2, 16, 32))] * 2)
    opts = WorkerOptions(
        model="tiny",
        token="t",
        redis_url=redis_url,
        redis_prefix=PREFIX,
        cache_budget_bytes=6 * block,
        cache_ttl_s=120,
        progress=False,
    )
    state = build(opts)
    with Background(state, "127.0.0.1", free_port()) as bg, httpx.Client(base_url=bg.url) as c:
        yield c, r


def test_evicted_blocks_come_back_from_redis(
    redis_worker: tuple[httpx.Client, redis.Redis],
) -> None:
    c, r = redis_worker
    a, b = list(range(1000, 1080)), list(range(2000, 2080))  # 5 blocks each
    body = {"max_tokens": 2, "temperature": 0}
    first = c.post("/v1/completions", json={"prompt": a, **body}).json()
    c.post("/v1/completions", json={"prompt": b, **body})  # pushes A's blocks out to Redis
    keys = sorted(k.decode() for k in r.keys("*"))  # type: ignore[union-attr]
    mine = [k for k in keys if k.startswith(PREFIX)]
    assert len(mine) == 4
    assert set(keys) - set(mine) == {"other:key", "kcops:kv:other-prefix"}
    assert all(0 < r.ttl(k) <= 120 for k in mine)
    again = c.post("/v1/completions", json={"prompt": a, **body}).json()
    assert again["kcops"]["cached_tokens"] == 64  # served from the Redis tier
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    state = c.get("/admin/state").json()
    assert state["cache"]["redis_hits"] == 4 and state["redis"]["loaded"] == 4
    assert state["redis"]["prefix"] == PREFIX and state["redis"]["errors"] == 0
    samples = {
        s.name: s.value
        for fam in text_string_to_metric_families(c.get("/metrics").text)
        for s in fam.samples
    }
    assert samples["kcops_worker_segment_transfer_seconds_count"] == 4
    assert samples["kcops_worker_segment_transfer_seconds_sum"] > 0
    # keys outside the prefix were never touched
    assert r.get("other:key") == b"keep me" and r.ttl("other:key") == -1
    assert r.get("kcops:kv:other-prefix") == b"not mine either"
