"""K(C) from a paged KV cache equals K(C) from the same keys laid out contiguously, for
each layout vLLM hands to ``Impl.forward`` and each way its backends store a window."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kcops.kernels import paged_kc
from kcops.kernels.kc import KcRow, kc_rows

HQ, HKV, D, BS = 6, 2, 16, 8
LAYOUTS = ("cpu", "flash", "flash_nhd", "stacked")


def _write(cache: torch.Tensor, layout: str, blk: int, start: int, chunk: torch.Tensor) -> None:
    """Keys ``chunk`` ``[HKV, t, D]`` at slots ``start..`` of block ``blk``."""
    t = chunk.shape[1]
    if layout == "cpu":  # per (block, head): all keys, then all values
        nb = cache.shape[0]
        cache.view(nb, HKV, 2 * BS, D)[blk, :, start : start + t] = chunk
    elif layout == "stacked":  # [2, blocks, block, heads, head]
        cache[0, blk, start : start + t] = chunk.transpose(0, 1)
    else:  # [blocks, heads, block, 2 * head]: each token's key, then its value
        cache[blk, :, start : start + t, :D] = chunk


def _cache(layout: str, num_blocks: int) -> torch.Tensor:
    if layout == "stacked":
        return torch.zeros(2, num_blocks, BS, HKV, D)
    if layout == "flash_nhd":  # vLLM's LBNHC order: [blocks, block, heads, 2*head] in memory
        return torch.zeros(num_blocks, BS, HKV, 2 * D).permute(0, 2, 1, 3)
    return torch.zeros(num_blocks, HKV, BS, 2 * D)


def _paged(
    keys: list[torch.Tensor], layout: str, num_blocks: int = 16
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's keys ``[HKV, L, D]`` written into a cache of ``layout`` through a
    shuffled block table, as vLLM's backends lay them out."""
    cache = _cache(layout, num_blocks)
    free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
    width = max(-(-k.shape[1] // BS) for k in keys)
    table = torch.zeros(len(keys), width, dtype=torch.int32)
    for i, k in enumerate(keys):
        for j in range(-(-k.shape[1] // BS)):
            blk = free.pop()
            table[i, j] = blk
            _write(cache, layout, blk, 0, k[:, j * BS : (j + 1) * BS])
    return cache, table


def _case(
    lengths: list[int], layout: str = "cpu", new_tokens: int = 1
) -> tuple[SimpleNamespace, torch.Tensor, torch.Tensor, list[torch.Tensor], SimpleNamespace]:
    """A step with ``new_tokens`` query rows per sequence (1: decode; more: a prefill
    chunk); ``key`` holds the keys those rows wrote, as vLLM passes them."""
    g = torch.Generator().manual_seed(7)
    keys = [torch.randn(HKV, n, D, generator=g) for n in lengths]
    cache, table = _paged(keys, layout)
    query = torch.randn(len(lengths) * new_tokens, HQ, D, generator=g)
    key = torch.cat([k[:, -new_tokens:].transpose(0, 1) for k in keys])
    meta = SimpleNamespace(
        query_start_loc=torch.arange(len(lengths) + 1, dtype=torch.int32) * new_tokens,
        seq_lens=torch.tensor(lengths, dtype=torch.int32),
        block_table=table,
        causal=True,
        dynamic_causal=None,
    )
    impl = SimpleNamespace(
        num_kv_heads=HKV, scale=D**-0.5, attn_type="decoder", alibi_slopes=None, sinks=None,
        logits_soft_cap=0, kv_cache_dtype="auto", sliding_window=-1,
    )  # fmt: skip
    return impl, query, key, keys, SimpleNamespace(cache=cache, meta=meta)


def _kc(inputs: paged_kc.KcInputs) -> list[KcRow]:
    return kc_rows(
        inputs.query, inputs.key, attention_mask=inputs.attention_mask, scaling=inputs.scaling,
        rows="last", p_values=(0.9, 0.5), topn=(4,), max_batch=4,
    ).to_rows()  # fmt: skip


def _reference(query: torch.Tensor, keys: torch.Tensor) -> KcRow:
    (ref,) = kc_rows(
        query[None, :, None], keys[None], attention_mask=None, scaling=D**-0.5,
        rows="last", p_values=(0.9, 0.5), topn=(4,),
    ).to_rows()  # fmt: skip
    return ref


@pytest.fixture(autouse=True)
def _forget_layouts() -> None:
    paged_kc._layout_of.clear()  # each case's impl class is SimpleNamespace: start afresh


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("new_tokens", [1, 3])
def test_paged_equals_contiguous(layout: str, new_tokens: int) -> None:
    lengths = [5, 19, 8]
    impl, query, key, keys, c = _case(lengths, layout, new_tokens)
    inputs = paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=4)
    assert inputs is not None
    paged = _kc(inputs)
    assert [r.visible for r in paged] == lengths
    for b, n in enumerate(lengths):
        ref = _reference(query[(b + 1) * new_tokens - 1], keys[b])
        assert paged[b].k_union == ref.k_union and paged[b].k_heads == ref.k_heads, n
        assert paged[b].topn_mass == pytest.approx(ref.topn_mass, abs=1e-6)
    expected = {"cpu": "split:", "stacked": "stacked"}.get(layout, "interleaved")
    assert paged_kc._layout_of[SimpleNamespace].startswith(expected)


@pytest.mark.parametrize(
    ("window", "seen"),
    [
        (-1, None), (0, None), (None, None), (4, 4), (100, None),  # int: the CPU backend
        ((3, 0), 4), ((-1, -1), None), ((3, -1), 4), ([7, 0], 8), ((100, 0), None),  # pairs
    ],
)  # fmt: skip
@pytest.mark.parametrize("layout", ["cpu", "flash"])
def test_sliding_windows_as_the_backends_store_them(
    window: object, seen: int | None, layout: str
) -> None:
    """FlashAttention, Triton, FlashInfer and ROCm keep ``(W - 1, 0)``; the CPU backend
    ``W``: both mean the row sees its last W keys."""
    impl, query, key, keys, c = _case([19], layout)
    impl.sliding_window = window
    inputs = paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=4)
    assert inputs is not None
    (row,) = _kc(inputs)
    visible = keys[0] if seen is None else keys[0][:, -seen:]
    assert row.visible == visible.shape[1]
    assert row.k_union == _reference(query[0], visible).k_union


@pytest.mark.parametrize("window", [(3, 5), (1, 2, 3), "4", 2.5, (0.5, 0)])
def test_a_window_it_cannot_read_gives_no_kc(window: object) -> None:
    impl, query, key, _keys, c = _case([19], "flash")
    impl.sliding_window = window
    assert paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=4) is None


def test_max_seqs_bounds_the_work() -> None:
    impl, query, key, _keys, c = _case([5, 19, 8])
    inputs = paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=2)
    assert inputs is not None and inputs.query.shape[0] == 2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_wrong_layout_is_an_error_not_a_wrong_value(layout: str) -> None:
    impl, query, key, _keys, c = _case([5, 19], layout)
    with pytest.raises(paged_kc.PagedLayoutError, match=r"differ|no known layout"):
        paged_kc.kc_inputs(impl, query, key + 1.0, c.cache, c.meta, max_seqs=4)
    # once the layout is known, a later mismatch is still caught, not summed
    assert paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=4) is not None
    with pytest.raises(paged_kc.PagedLayoutError, match="differ"):
        paged_kc.kc_inputs(impl, query, key * 2.0, c.cache, c.meta, max_seqs=4)


def test_an_unknown_cache_shape_is_a_layout_error() -> None:
    impl, query, key, _keys, c = _case([5])
    with pytest.raises(paged_kc.PagedLayoutError, match="expected"):
        paged_kc.kc_inputs(impl, query, key, torch.zeros(4, 3, BS, D), c.meta, max_seqs=4)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alibi_slopes", torch.ones(HQ)),
        ("logits_soft_cap", 30.0),
        ("kv_cache_dtype", "fp8"),
        ("attn_type", "encoder_only"),
        ("kv_sharing_target_layer_name", "model.layers.0.self_attn.attn"),
    ],
)
def test_unsupported_attention_gives_no_kc(field: str, value: object) -> None:
    impl, query, key, _keys, c = _case([5])
    setattr(impl, field, value)
    assert paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=4) is None
