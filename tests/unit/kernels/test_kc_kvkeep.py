"""Top-N KV retention: what is kept, and that the worker's KV bytes follow the budget."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import torch

from kcops.agent.collectors import promtext
from kcops.agent.engine.kinds import builtin_kinds
from kcops.kernels.kvkeep import KeptLayer, compress_request, split_budget
from kcops.worker.app import Background, WorkerOptions, build
from kcops.worker.engine import Event, GenRequest
from kcops.worker.server import WorkerState
from tests.services import free_port, wait_until


def test_compress_keeps_sinks_recent_and_the_best_scored_per_head() -> None:
    torch.manual_seed(0)
    hkv, t, d, n = 2, 50, 4, 16
    keys, values = torch.randn(hkv, t, d), torch.randn(hkv, t, d)
    score = torch.rand(hkv, t)
    kept = compress_request(keys, values, score, n)
    sinks, recent = split_budget(n)
    for h in range(hkv):
        forced = set(range(sinks)) | set(range(t - recent, t))
        rest = sorted(set(range(t)) - forced, key=lambda j: -float(score[h, j]))
        want = sorted(forced | set(rest[: n - len(forced)]))
        got = [int(torch.nonzero((keys[h] == kept.keys[h, i]).all(-1))[0]) for i in range(n)]
        assert got == want
        assert torch.equal(kept.values[h], values[h, want])
    assert kept.logical == t and kept.nbytes * t == (keys.nbytes + values.nbytes) * n


def test_padded_keys_are_never_kept_over_real_ones() -> None:
    layer = KeptLayer()
    keys = torch.arange(10.0).reshape(1, 1, 10, 1)
    layer.update(keys, keys)
    layer.valid = torch.tensor([[[False] * 4 + [True] * 6]])
    layer.score = torch.tensor([[[9.0] * 4 + [0.0] * 6]])  # padding scores high
    layer.compress(5)
    assert layer.valid is not None and bool(layer.valid.all())
    assert layer.keys is not None and layer.keys.flatten().tolist()[0] >= 4


@pytest.fixture(scope="module")
def state() -> Iterator[WorkerState]:
    torch.set_num_threads(1)
    opts = WorkerOptions(
        model="tiny", long_threshold=8, top_n=32, dense_layers=frozenset(), progress=False
    )
    yield build(opts)


def _start(state: WorkerState, prompt: list[int], max_tokens: int) -> list[Event]:
    events: list[Event] = []
    state.engine.submit(GenRequest(prompt_ids=prompt, max_tokens=max_tokens, emit=events.append))
    return events


def _text(events: list[Event]) -> str:
    assert events[-1].kind == "done", events
    return "".join(e.text for e in events if e.kind == "delta")


def key_bytes(state: WorkerState) -> int:
    """KV bytes of one token in every layer: K and V, each KV head, float32."""
    cfg: Any = state.engine.model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * 4


def test_kv_bytes_scale_with_n_and_fall_when_n_is_lowered(state: WorkerState) -> None:
    eng: Any = state.engine
    per_key = key_bytes(state)
    prompt = list(range(1000, 1256))  # 256 tokens
    state.control.set_mode("fallback")
    _start(state, prompt, 4)
    with torch.inference_mode():
        eng._iteration()  # prefill + the first decode step: 257 keys per layer
    assert eng.kv_bytes == 257 * per_key
    while eng.running:
        with torch.inference_mode():
            eng._iteration()
    state.control.set_mode("normal")
    eng.cache.evict("all")
    eng.kv_bytes_peak = 0
    events = _start(state, prompt, 40)
    for _ in range(3):  # after every step each layer is cut back to exactly N keys
        with torch.inference_mode():
            eng._iteration()
        assert eng.kv_bytes == 32 * per_key  # N/C of full attention's, no slack
    state.control.set_budget(top_n=16)
    with torch.inference_mode():
        eng._iteration()
    assert eng.kv_bytes == 16 * per_key
    while eng.running:
        with torch.inference_mode():
            eng._iteration()
    assert eng.kv_bytes_peak == 32 * per_key
    state.control.set_budget(top_n=32)
    assert _text(events)


@pytest.mark.slow
def test_lowering_n_through_the_admin_api_shows_in_the_agents_kv_series() -> None:
    """A real tiny worker over HTTP: while a request decodes (slowed by the token-delay
    drill), ``POST /admin/attention`` lowers N and the agent's ``kcops_kv_cache_bytes``
    (the kcops adapter's reading of ``kcops_worker_kv_bytes``) falls from N=64 keys per
    layer to N=16."""
    opts = WorkerOptions(
        model="tiny",
        long_threshold=8,
        top_n=64,
        dense_layers=frozenset(),
        token="secret",
        enable_faults=True,
        install_probe=False,
        progress=False,
    )
    state = build(opts)
    per_key = key_bytes(state)
    adapter = builtin_kinds().get("kcops").adapter
    auth = {"Authorization": "Bearer secret"}

    def kv_series(c: httpx.Client) -> float:
        page = c.get("/metrics").text
        mapped = adapter.map(promtext.parse(page, adapter.wanted()))
        got = [s for s in mapped if s.name == "kcops_kv_cache_bytes"]
        assert [s.key.label_dict() for s in got] == [{"engine": "kcops", "model_name": "tiny"}]
        return got[0].value

    def kv_at(c: httpx.Client, want: float) -> None:
        wait_until(lambda: kv_series(c) == want, 60, f"kcops_kv_cache_bytes at {want}")

    stop = threading.Event()
    with Background(state, "127.0.0.1", free_port()) as bg, httpx.Client(base_url=bg.url) as c:
        c.post("/admin/faults", json={"token_delay_ms": 100}, headers=auth).raise_for_status()

        def stream() -> None:
            body = {"model": "tiny", "prompt": list(range(500, 800)), "max_tokens": 1000}
            url = bg.url + "/v1/completions"
            with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as r:
                for _ in r.iter_lines():
                    if stop.is_set():
                        return  # hanging up cancels the request

        t = threading.Thread(target=stream, daemon=True)
        t.start()
        try:
            kv_at(c, 64 * per_key)
            r = c.post("/admin/attention", json={"top_n": 16}, headers=auth)
            r.raise_for_status()
            assert r.json()["after"]["top_n"] == 16
            kv_at(c, 16 * per_key)  # cut at the next decode step
        finally:
            stop.set()
            t.join(30)
        kv_at(c, 0)  # the cancelled request let go of its KV


def test_budget_above_prompt_and_output_decodes_like_full_attention(state: WorkerState) -> None:
    eng: Any = state.engine
    prompt = list(range(3000, 3020))  # 20 tokens + 11 decode steps < N = 32: nothing dropped
    texts = []
    for mode in ("fallback", "normal"):
        state.control.set_mode(mode)
        eng.cache.evict("all")
        events = _start(state, prompt, 12)
        with torch.inference_mode():
            while not events or events[-1].kind != "done":
                eng._iteration()
        texts.append(_text(events))
    state.control.set_mode("normal")
    assert texts[0] == texts[1]
