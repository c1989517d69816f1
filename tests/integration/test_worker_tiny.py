"""The reference worker on the seeded tiny model, in-process, over real HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from kcops.worker.app import Background, WorkerOptions, build
from kcops.worker.server import WorkerState
from tests.services import free_port

TOKEN = "s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LONG = "The quick brown fox jumps over the lazy dog. " * 12  # ~120 tokens
SHORT = "Hello there"


@pytest.fixture(scope="module")
def worker() -> Iterator[tuple[WorkerState, httpx.Client]]:
    torch.set_num_threads(1)
    opts = WorkerOptions(
        model="tiny",
        token=TOKEN,
        long_threshold=64,
        top_n=16,
        dense_layers=frozenset({0}),
        enable_faults=True,
        progress=False,
    )
    state = build(opts)
    bg = Background(state, "127.0.0.1", free_port())
    with bg, httpx.Client(base_url=bg.url, timeout=60) as client:
        yield state, client


def complete(c: httpx.Client, prompt: Any, **kw: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, **kw}
    r = c.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def scrape(c: httpx.Client) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(c.get("/metrics").text):
        for s in fam.samples:
            key = s.name + json.dumps(
                {k: v for k, v in sorted(s.labels.items()) if k != "model_name"}
            )
            out[key] = s.value
    return out


def test_health_and_models(worker: tuple[WorkerState, httpx.Client]) -> None:
    _, c = worker
    assert c.get("/health").json() == {"status": "ok"}
    models = c.get("/v1/models").json()
    assert models["data"][0]["id"] == "tiny" and models["data"][0]["max_model_len"] == 2048
    assert c.get("/version").json()["engine"] == "kcops"


def test_greedy_is_deterministic_and_repeat_is_a_prefix_hit(
    worker: tuple[WorkerState, httpx.Client],
) -> None:
    _, c = worker
    prompt = "A repeated prompt about caches. " * 6
    before = scrape(c)
    a = complete(c, prompt)
    b = complete(c, prompt)
    after = scrape(c)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["kcops"]["cached_tokens"] == 0 and b["kcops"]["cached_tokens"] >= 32
    n = a["usage"]["prompt_tokens"]
    q = "vllm:prefix_cache_queries_total{}"
    h = "vllm:prefix_cache_hits_total{}"
    assert after[q] - before[q] == 2 * n
    assert after[h] - before[h] == b["kcops"]["cached_tokens"]
    # reset makes the next one a miss
    assert c.post("/reset_prefix_cache").status_code == 401
    r = c.post("/reset_prefix_cache", headers=AUTH).json()
    assert r["reset"] is True and r["evicted_blocks"] >= 2
    assert complete(c, prompt)["kcops"]["cached_tokens"] == 0


def test_streaming_matches_non_streaming(worker: tuple[WorkerState, httpx.Client]) -> None:
    _, c = worker
    full = complete(c, SHORT, max_tokens=8)["choices"][0]["text"]
    parts, done, finish = [], False, None
    body = {"prompt": SHORT, "max_tokens": 8, "temperature": 0, "stream": True}
    with c.stream("POST", "/v1/completions", json=body) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        for line in s.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                continue
            chunk = json.loads(line[6:])
            parts.append(chunk["choices"][0]["text"])
            finish = chunk["choices"][0]["finish_reason"] or finish
    assert done and finish == "length" and "".join(parts) == full


def test_concurrent_requests_batch_to_the_same_texts(
    worker: tuple[WorkerState, httpx.Client],
) -> None:
    _, c = worker
    prompts = [f"Story number {i}: once upon a time" + " there" * i for i in range(5)]
    alone = [complete(c, p, max_tokens=10)["choices"][0]["text"] for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        together = list(pool.map(lambda p: complete(c, p, max_tokens=10), prompts))
    assert [t["choices"][0]["text"] for t in together] == alone


def test_stop_string_and_sampling(worker: tuple[WorkerState, httpx.Client]) -> None:
    _, c = worker
    text = complete(c, SHORT, max_tokens=8)["choices"][0]["text"]
    stop = text[3:6]
    r = complete(c, SHORT, max_tokens=8, stop=[stop])
    assert r["choices"][0]["finish_reason"] == "stop"
    assert stop not in r["choices"][0]["text"]
    s1 = complete(c, SHORT, temperature=1.0, seed=7)["choices"][0]["text"]
    s2 = complete(c, SHORT, temperature=1.0, seed=7)["choices"][0]["text"]
    assert s1 == s2


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 4},
        {"prompt": "hi", "max_tokens": -1},
        {"prompt": "hi", "max_tokens": 0},
        {"prompt": "word " * 2100, "max_tokens": 4},
        {"prompt": "hi", "temperature": -1},
        '{"prompt": "hi", "temperature": NaN}',  # Python's JSON parser accepts NaN
        {"prompt": [1, -1]},
        {"prompt": [10**9]},
        {"prompt": "hi", "seed": 2**64},
        [1, 2],
    ],
)
def test_bad_requests_get_400_and_the_server_keeps_serving(
    worker: tuple[WorkerState, httpx.Client], body: Any
) -> None:
    _, c = worker
    if isinstance(body, str):
        r = c.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    else:
        r = c.post("/v1/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["message"]
    complete(c, SHORT, max_tokens=1)


def test_malformed_json_and_unknown_route(worker: tuple[WorkerState, httpx.Client]) -> None:
    _, c = worker
    r = c.post(
        "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert c.get("/nope").status_code == 404
    assert c.get("/nope").json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    "path,body",
    [
        ("/admin/cache/evict", {"policy": "all"}),
        ("/admin/route", {"mode": "fallback"}),
        ("/admin/attention", {"top_n": 32}),
        ("/admin/drain", {"admit": False}),
        ("/admin/faults", {"clear": True}),
        ("/reset_prefix_cache", {}),
    ],
)
def test_admin_needs_the_token(
    worker: tuple[WorkerState, httpx.Client], path: str, body: dict[str, Any]
) -> None:
    _, c = worker
    assert c.post(path, json=body).status_code == 401
    r = c.post(path, json=body, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"


def test_routing_fallback_and_attention_budget(worker: tuple[WorkerState, httpx.Client]) -> None:
    _, c = worker
    assert complete(c, SHORT)["kcops"]["route"] == "base"
    long = complete(c, LONG)["kcops"]
    assert long["route"] == "optimized" and long["top_n"] == 16
    r = c.post("/admin/attention", json={"top_n": 24}, headers=AUTH).json()
    assert r["before"]["top_n"] == 16 and r["after"]["top_n"] == 24
    assert complete(c, LONG)["kcops"]["top_n"] == 24
    bad = c.post("/admin/attention", json={"top_n": 4}, headers=AUTH)
    assert bad.status_code == 400 and "[16, 1024]" in bad.json()["error"]["message"]
    r = c.post(
        "/admin/attention",
        json={"top_n_by_layer": {"1": 20}, "dense_layers": [0]},
        headers=AUTH,
    ).json()
    assert r["after"]["top_n_by_layer"] == {"1": 20}
    assert c.post("/admin/route", json={"mode": "fallback"}, headers=AUTH).json() == {
        "before": "normal",
        "after": "fallback",
    }
    assert complete(c, LONG)["kcops"]["route"] == "base"
    assert scrape(c)["kcops_worker_route_fallback{}"] == 1
    c.post("/admin/route", json={"mode": "normal"}, headers=AUTH)
    c.post("/admin/attention", json={"top_n": 16, "top_n_by_layer": {}}, headers=AUTH)
    st = c.get("/admin/state").json()
    assert st["route_mode"] == "normal" and st["top_n"] == 16 and st["top_n_bounds"] == [16, 1024]
    assert scrape(c)["kcops_worker_attention_topn{}"] == 16


def test_metrics_parse_histograms_cumulative_counts_match(
    worker: tuple[WorkerState, httpx.Client],
) -> None:
    _, c = worker
    before = scrape(c)
    for i in range(3):
        complete(c, f"count me {i}")
    after = scrape(c)
    for name in ("vllm:e2e_request_latency_seconds", "vllm:time_to_first_token_seconds"):
        key = name + "_count{}"
        assert after[key] - before[key] == 3
        buckets = sorted(
            (float(json.loads(k[len(name + "_bucket") :])["le"]), v)
            for k, v in after.items()
            if k.startswith(name + "_bucket")
        )
        values = [v for _, v in buckets]
        assert values == sorted(values) and values[-1] == after[key]
    ok = 'vllm:request_success_total{"finished_reason": "length"}'
    assert after[ok] - before[ok] == 3
    assert "vllm:kv_cache_usage_perc{}" in after and "vllm:num_requests_waiting{}" in after


def test_drain_and_evict(worker: tuple[WorkerState, httpx.Client]) -> None:
    _, c = worker
    r = c.post("/admin/drain", json={"admit": False}, headers=AUTH).json()
    assert r == {"admitting": False, "in_flight": 0}
    assert c.post("/v1/completions", json={"prompt": "x"}).status_code == 503
    assert c.post("/admin/drain", json={"admit": True}, headers=AUTH).json()["admitting"]
    complete(c, LONG)
    blocks = c.get("/admin/state").json()["cache"]["blocks"]
    assert blocks >= 4
    r = c.post("/admin/cache/evict", json={"policy": "lru", "fraction": 0.5}, headers=AUTH).json()
    assert r["evicted_blocks"] == round(blocks * 0.5) and r["freed_bytes"] > 0
    assert r["before"]["blocks"] == blocks and r["after"]["blocks"] == blocks - r["evicted_blocks"]
    r = c.post("/admin/cache/evict", json={"policy": "expired"}, headers=AUTH).json()
    assert r["evicted_blocks"] == 0  # nothing idle longer than the TTL
    bad = c.post("/admin/cache/evict", json={"policy": "random"}, headers=AUTH)
    assert bad.status_code == 400


def test_shadow_agreement(worker: tuple[WorkerState, httpx.Client]) -> None:
    state, c = worker
    assert "kcops_worker_shadow_agreement_ratio{}" not in scrape(c)  # absent, not 0
    state.engine.shadow_fraction = 1.0
    try:
        for i in range(2):
            complete(c, f"{i} " + LONG)
    finally:
        state.engine.shadow_fraction = 0.0
    m = scrape(c)
    assert m["kcops_worker_shadow_checks_total{}"] == 2
    assert 0.0 <= m["kcops_worker_shadow_agreement_ratio{}"] <= 1.0


def test_faults_latency_nan_memory_hang(worker: tuple[WorkerState, httpx.Client]) -> None:
    state, c = worker
    f = "/admin/faults"
    assert c.post(f, json={"bogus": 1}, headers=AUTH).status_code == 400
    c.post(f, json={"latency_ms": 300}, headers=AUTH)
    t0 = time.monotonic()
    complete(c, SHORT, max_tokens=1)
    assert time.monotonic() - t0 >= 0.3
    # NaN goes into the attention output (seen by a hook on the last layer's attention)
    seen: list[bool] = []
    attn = state.engine.model.model.layers[-1].self_attn
    hook = attn.register_forward_hook(lambda m, i, o: seen.append(bool(torch.isnan(o[0]).any())))
    try:
        c.post(f, json={"nan": True, "latency_ms": 0}, headers=AUTH)
        complete(c, SHORT, max_tokens=2)
    finally:
        hook.remove()
    assert seen and all(seen)
    rss0 = psutil.Process(os.getpid()).memory_info().rss
    r = c.post(f, json={"hold_memory_bytes": 200 * 1024**2}, headers=AUTH).json()
    assert r["after"]["hold_memory_bytes"] == 200 * 1024**2
    assert psutil.Process(os.getpid()).memory_info().rss - rss0 > 150 * 1024**2
    c.post(f, json={"hang": True}, headers=AUTH)
    with pytest.raises(httpx.TimeoutException):
        c.get("/health", timeout=1.0)
    r = c.post(f, json={"clear": True}, headers=AUTH).json()
    assert r["after"] == {
        "nan": False,
        "stall": False,
        "latency_ms": 0.0,
        "token_delay_ms": 0.0,
        "hold_memory_bytes": 0,
        "memory_ramp": None,
        "hang": False,
        "cache_budget_bytes": None,
    }
    assert c.get("/health").json() == {"status": "ok"}
    complete(c, SHORT, max_tokens=1)
    state.enable_faults = False
    try:
        assert c.post(f, json={"clear": True}, headers=AUTH).status_code == 404
    finally:
        state.enable_faults = True
