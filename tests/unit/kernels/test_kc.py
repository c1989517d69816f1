"""K(C) of sampled rows equals a brute-force computation from the full attention matrix."""

from __future__ import annotations

import pytest
import torch

import kcops.kernels as kernels
from kcops.kernels.kc import k_from_sorted, kc_rows, row_index
from tests.unit.kernels.conftest import text_ids, tiny_llama

P_VALUES = (0.5, 0.8, 0.9, 0.95, 0.99)


def brute_force(weights: torch.Tensor, kv_heads: int, p: float) -> tuple[list[int], int]:
    """Per-head K_p and the largest per-KV-group union, from one full attention row
    ``[Hq, T]`` (sorted per head in Python, cumulative mass in float64)."""
    hq = weights.shape[0]
    group = hq // kv_heads
    per_head: list[int] = []
    sets: list[set[int]] = []
    for h in range(hq):
        row = weights[h].tolist()
        order = sorted(range(len(row)), key=lambda j: -row[j])
        acc = torch.tensor(0.0, dtype=torch.float64)
        k = 0
        for j in order:
            acc += torch.tensor(row[j], dtype=torch.float32).double()
            k += 1
            if acc >= p:
                break
        per_head.append(k)
        sets.append(set(order[:k]))
    unions = [len(set().union(*sets[g * group : (g + 1) * group])) for g in range(kv_heads)]
    return per_head, max(unions)


@pytest.mark.parametrize("offset,length", [(0, 48), (5000, 64), (20000, 33)])
def test_kp_matches_full_attention_matrix(offset: int, length: int) -> None:
    model = tiny_llama("eager")
    ids = text_ids(length, offset)
    probe = kernels.install(
        kernels.ProbeConfig(
            sample_rate=1.0, rows="all", p_values=P_VALUES, record=True, publish=False
        )
    )
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    records = probe.records
    assert len(records) == 2 * length
    checked = 0
    for layer, row in records:
        full = out.attentions[int(layer)][0, :, row.position, : row.position + 1]
        assert row.visible == row.position + 1
        for p in P_VALUES:
            heads, union = brute_force(full, kv_heads=2, p=p)
            assert row.k_heads[p] == heads, (layer, row.position, p)
            assert row.k_union[p] == union, (layer, row.position, p)
            checked += 1
    assert checked == 2 * length * len(P_VALUES)
    # the model is peaked enough that K_p is not trivially the whole context
    assert any(row.k_union[0.5] < row.visible for _, row in records)


def test_decode_step_uses_last_row_and_cache() -> None:
    model = tiny_llama("eager")
    ids = text_ids(30, 100)
    probe = kernels.install(
        kernels.ProbeConfig(sample_rate=1.0, rows="last", record=True, publish=False)
    )
    with torch.no_grad():
        first = model(ids, use_cache=True)
        nxt = first.logits[:, -1:].argmax(-1)
        second = model(nxt, cache=first.past_key_values, output_attentions=True)
    decode = probe.records[-2:]
    for layer, row in decode:
        assert row.position == 30
        assert row.visible == 31
        full = second.attentions[int(layer)][0, :, 0, :]
        heads, union = brute_force(full, 2, 0.9)
        assert row.k_heads[0.9] == heads
        assert row.k_union[0.9] == union


def test_topn_mass_and_kappa() -> None:
    q = torch.randn(1, 4, 10, 8)
    k = torch.randn(1, 2, 10, 8)
    res = kc_rows(
        q, k, attention_mask=None, scaling=None, rows="all", p_values=(0.9,), topn=(1, 4, 64)
    ).to_rows()
    assert len(res) == 10
    for row in res:
        assert row.topn_mass[64] == pytest.approx(1.0, abs=1e-5)
        assert 0.0 < row.topn_mass[1] <= row.topn_mass[4] <= 1.0 + 1e-6
        assert row.kappa(0.9) == row.k_union[0.9] / row.visible
        assert 1 <= row.k_union[0.9] <= row.visible
    assert res[0].k_union[0.9] == 1  # the first row sees one key


def test_bool_and_additive_masks_agree() -> None:
    q = torch.randn(2, 4, 6, 8)
    k = torch.randn(2, 4, 6, 8)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    additive = torch.zeros(6, 6).masked_fill(~causal, torch.finfo(torch.float32).min)
    kw = {"scaling": 0.3, "rows": "all", "p_values": (0.9,), "topn": (2,)}
    a = kc_rows(q, k, attention_mask=causal[None, None].expand(2, 1, 6, 6), **kw).to_rows()
    b = kc_rows(q, k, attention_mask=additive[None, None], **kw).to_rows()
    c = kc_rows(q, k, attention_mask=None, is_causal=True, **kw).to_rows()
    assert [r.k_heads for r in a] == [r.k_heads for r in b] == [r.k_heads for r in c]
    assert [r.visible for r in a] == [r.visible for r in b] == [r.visible for r in c]


def test_nan_rows_are_skipped() -> None:
    q = torch.randn(1, 2, 3, 4)
    q[0, 0, 2] = float("nan")
    k = torch.randn(1, 2, 3, 4)
    rows = kc_rows(
        q, k, attention_mask=None, scaling=None, rows="all", p_values=(0.9,), topn=(2,)
    ).to_rows()
    assert [r.position for r in rows] == [0, 1]


def select_rows(tq: int, rows: str | int) -> list[int]:
    return [int(i) for i in row_index(tq, rows, torch.device("cpu"))]


def test_select_rows() -> None:
    assert select_rows(10, "last") == [9]
    assert select_rows(4, "all") == [0, 1, 2, 3]
    assert select_rows(10, 3) == [0, 4, 9] or select_rows(10, 3) == [0, 5, 9]
    assert select_rows(10, 1) == [9]
    assert select_rows(3, 8) == [0, 1, 2]
    assert select_rows(1, "all") == [0]


def test_k_from_sorted() -> None:
    w = torch.tensor([[0.5, 0.3, 0.1, 0.1]])
    assert k_from_sorted(w, 0.5).tolist() == [1]
    assert k_from_sorted(w, 0.8).tolist() == [2]
    assert k_from_sorted(w, 0.81).tolist() == [3]
    assert k_from_sorted(w, 1.0).tolist() == [4]
