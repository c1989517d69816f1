"""Top-N KV retention: what is kept, and that the worker's KV bytes follow the budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kcops.kernels.kvkeep import KeptLayer, compress_request, split_budget
from kcops.worker.app import WorkerOptions, build
from kcops.worker.engine import Event, GenRequest
from kcops.worker.server import WorkerState


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


def test_kv_bytes_scale_with_n_and_fall_when_n_is_lowered(state: WorkerState) -> None:
    eng: Any = state.engine
    prompt = list(range(1000, 1256))  # 256 tokens
    state.control.set_mode("fallback")
    _start(state, prompt, 4)
    with torch.inference_mode():
        eng._iteration()
    full = eng.kv_bytes
    while eng.running:
        with torch.inference_mode():
            eng._iteration()
    state.control.set_mode("normal")
    eng.cache.evict("all")
    events = _start(state, prompt, 40)
    with torch.inference_mode():
        eng._iteration()
    assert 0 < eng.kv_bytes <= full * (32 + 1) / 256
    state.control.set_budget(top_n=16)
    with torch.inference_mode():
        eng._iteration()
    assert eng.kv_bytes <= full * 16 / 256
    assert b"kcops_worker_kv_bytes" in state.metrics.exposition()
    while eng.running:
        with torch.inference_mode():
            eng._iteration()
    state.control.set_budget(top_n=32)
    assert _text(events)


def test_budget_above_the_prompt_decodes_like_full_attention(state: WorkerState) -> None:
    eng: Any = state.engine
    prompt = list(range(3000, 3030))  # 30 tokens < N = 32: nothing dropped
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
