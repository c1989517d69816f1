"""``kc_live``: per-layer budgets re-split while decoding (kcops.lab.kclive)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from kcops.kernels.kvkeep import KeptLayer
from kcops.kernels.topn import register
from kcops.lab.kclive import LiveBudget, edge_mass, observe_step, resplit
from kcops.lab.sweep import (
    POLICIES,
    budgets,
    chunks,
    corpus_text,
    decode_groups,
    prefill,
    sweep_context,
)
from kcops.lab.sweepbatch import GroupedLayer
from kcops.worker.models import load_model

CONTEXT, EVAL, SEQS = 256, 16, 2


@pytest.fixture(scope="module")
def tiny() -> Iterator[tuple[Any, torch.Tensor]]:
    torch.set_num_threads(1)
    model, tok = load_model("tiny", progress=False, attn_implementation=register())
    ids = tok(corpus_text("pydoc", 40_000), add_special_tokens=False).input_ids
    yield model, chunks(ids, SEQS, CONTEXT)


def test_resplit_keeps_the_total_and_the_bounds_and_grows_a_key_a_step() -> None:
    b = [32, 32, 32, 32]
    for edge in ([1.0, 0.0, 0.0, 0.0], [5.0, 1.0, 1.0, 0.1], [None, 2.0, 1.0, 1.0]):
        got = resplit(b, edge, 128, 1024, 4)
        assert sum(got) == 128 and all(1 <= x <= 1024 for x in got)
        assert all(x - y <= 4 for x, y in zip(got, b, strict=True))  # growth rate-limited
    assert resplit(b, [2.0, 1.0, 1.0, 1.0], 128, 1024, 4)[0] == 36
    assert resplit(b, [1.0, 1.0, 1.0, 1.0], 128, 1024, 4) == b  # equal edges: a fixed point
    assert resplit(b, [None] * 4, 128, 1024, 4) == b  # nothing measured: nothing moves
    # capped at the context: a layer never holds more than every key
    got = [8, 8]
    for _ in range(20):
        got = resplit(got, [1.0, 0.01], 16, 10, 4)
    assert got == [10, 6]
    # a layer cut to 1 key stays at 1
    got = [2, 30]
    for _ in range(20):
        got = resplit(got, [0.0, 1.0], 32, 100, 4)
    assert got == [1, 31]


def test_edge_mass_is_the_mass_on_the_lowest_scored_heavy_hitters() -> None:
    t, n = 33, 32  # sinks 4, recent 8, heavy 20 (and the step's key): edge = 2 keys
    valid = torch.ones(1, 1, t, dtype=torch.bool)
    score = torch.arange(t, dtype=torch.float32)[None, None].flip(-1).clone()
    mass = torch.zeros(1, 1, t)
    # keys 4..24 are the heavy hitters; lowest scores: 23 and 24 (score descends)
    mass[..., 23] = 0.2
    mass[..., 24] = 0.4
    mass[..., 0] = 1.4  # a sink: never the edge
    assert edge_mass(mass, valid, score, n, heads_per_group=2) == pytest.approx(0.15)
    assert edge_mass(mass, valid, score, 8, heads_per_group=1) is not None
    # no heavy hitters at all: nothing to say
    # (a budget of 8 over 3 keys: 1 sink, 2 recent)
    assert edge_mass(mass[..., :3], valid[..., :3], score[..., :3], 8, 1) is None


def _layer(keys: torch.Tensor) -> KeptLayer:
    """One compressed layer: keys (1, 1, T, D) as values too, scores from a spread prefill."""
    layer = KeptLayer()
    layer.update(keys, keys.clone())
    layer.valid = torch.ones(keys.shape[:3], dtype=torch.bool)
    layer.score = torch.linspace(1.0, 0.5, keys.shape[2])[None, None].clone()
    return layer


def test_the_spread_layer_gets_more_keys_than_the_peaked_one() -> None:
    """Two layers, the same uniform start: layer 0's decode rows spread their attention
    over every key, layer 1's put it all on one key. kc_live moves keys to layer 0, one a
    step, and the total held never exceeds N x layers."""
    torch.manual_seed(0)
    n, d, t0 = 16, 8, 64
    spread = _layer(torch.zeros(1, 1, t0, d))  # equal logits: uniform attention
    peaked_keys = torch.randn(1, 1, t0, d) * 0.01
    peaked_keys[0, 0, 5] = 30.0  # one key every query locks on to
    peaked = _layer(peaked_keys)
    for kept in (spread, peaked):
        kept.compress(n)
    layers = [GroupedLayer([spread], 1), GroupedLayer([peaked], 1)]
    for layer in layers:
        layer.track = {0}
    live = LiveBudget([n, n], cap=t0 + 64)
    for _ in range(24):
        q = torch.ones(1, 1, 1, d)
        for layer in layers:
            new = torch.zeros(1, 1, 1, d)
            layer.update(new, new)
            layer.attend(q, scaling=1.0)
        observe_step(live, layers, 0, heads_per_group=1)
        per = live.step()
        assert sum(b or 0 for b in per) == 2 * n and all(1 <= (b or 0) <= t0 + 64 for b in per)
        for layer, b in zip(layers, per, strict=True):
            layer.evict([b])
        held = sum(
            layer.subs[0].keys.shape[-2] for layer in layers if layer.subs[0].keys is not None
        )
        assert held <= 2 * n
    assert live.budgets[0] is not None and live.budgets[1] is not None
    assert live.budgets[0] > n > live.budgets[1]
    assert live.edge[0] is not None and live.edge[1] is not None
    assert live.edge[0] > 10 * live.edge[1]
    first = [b[0] or 0 for b in live.trace]
    assert first == sorted(first)  # grows steadily


def test_kc_live_budgets_while_decoding_the_tiny_model(tiny: Any) -> None:
    model, seqs = tiny
    pre = prefill(model, seqs, EVAL)
    layers = len(pre.kv)
    n = 8
    per = budgets("kc_live", n, layers, CONTEXT, pre.kp)
    assert per == [n] * layers  # the start: uniform
    live = LiveBudget(list(per), CONTEXT, every=2)
    plain, got = decode_groups(model, pre, [(per, True), (per, True)], [None, live])
    ev = got["live"]
    assert plain["live"] is None and ev["every"] == 2
    assert len(ev["budgets"]) == 1 + EVAL // 2
    for split in ev["budgets"]:  # the same memory as uniform's at every re-split
        assert sum(split) == n * layers and all(1 <= b <= CONTEXT for b in split)
    assert all(e is not None and e > 0 for e in ev["edge_mass"])
    assert all(k is not None and 1 <= k <= n + 1 for k in ev["kept_k0.9"])
    assert got["kv_bytes"] <= plain["kv_bytes"]  # never more keys held than uniform's


def test_sweep_runs_kc_live_and_names_it(tiny: Any) -> None:
    assert "kc_live" in POLICIES
    model, seqs = tiny
    rows = sweep_context(
        model,
        seqs,
        ns=[8, CONTEXT],
        policies=["uniform", "kc_live"],
        eval_tokens=EVAL,
        done={},
        on_row=lambda r: None,
    )
    live = {r.n: r for r in rows if r.policy == "kc_live"}
    uni = {r.n: r for r in rows if r.policy == "uniform"}
    assert live[8].live is not None and live[8].kv_bytes <= uni[8].kv_bytes
    assert live[CONTEXT].live is None  # N covers the context: full attention, nothing to split
    assert live[CONTEXT].agreement == 1.0
