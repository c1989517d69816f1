"""K(C) from a paged KV cache equals K(C) from the same keys laid out contiguously."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kcops.kernels import paged_kc
from kcops.kernels.kc import kc_rows

HQ, HKV, D, BS = 6, 2, 16, 8


def _paged(keys: list[torch.Tensor], num_blocks: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Write each sequence's keys ``[HKV, L, D]`` into a cpu-layout cache through a shuffled
    block table, as vLLM's CPU backend lays it out."""
    cache = torch.zeros(num_blocks, HKV, BS, 2 * D)
    view = cache.view(num_blocks, HKV, 2 * BS, D)
    free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()
    width = max(-(-k.shape[1] // BS) for k in keys)
    table = torch.zeros(len(keys), width, dtype=torch.int32)
    for i, k in enumerate(keys):
        for j in range(-(-k.shape[1] // BS)):
            blk = free.pop()
            table[i, j] = blk
            chunk = k[:, j * BS : (j + 1) * BS]
            view[blk, :, : chunk.shape[1]] = chunk
    return cache, table


def _case(
    lengths: list[int],
) -> tuple[SimpleNamespace, torch.Tensor, torch.Tensor, list[torch.Tensor], SimpleNamespace]:
    g = torch.Generator().manual_seed(7)
    keys = [torch.randn(HKV, n, D, generator=g) for n in lengths]
    cache, table = _paged(keys)
    # decode step: one query row per sequence; `key` holds the row's own (last) key
    query = torch.randn(len(lengths), HQ, D, generator=g)
    key = torch.stack([k[:, -1] for k in keys])
    meta = SimpleNamespace(
        query_start_loc=torch.arange(len(lengths) + 1, dtype=torch.int32),
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


def test_paged_equals_contiguous() -> None:
    lengths = [5, 19, 8]
    impl, query, key, keys, c = _case(lengths)
    inputs = paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=4)
    assert inputs is not None
    paged = kc_rows(
        inputs.query, inputs.key, attention_mask=inputs.attention_mask, scaling=inputs.scaling,
        rows="last", p_values=(0.9, 0.5), topn=(4,), max_batch=4,
    ).to_rows()  # fmt: skip
    assert [r.visible for r in paged] == lengths
    for b, n in enumerate(lengths):
        (ref,) = kc_rows(
            query[b][None, :, None], keys[b][None], attention_mask=None, scaling=D**-0.5,
            rows="last", p_values=(0.9, 0.5), topn=(4,),
        ).to_rows()  # fmt: skip
        assert paged[b].k_union == ref.k_union and paged[b].k_heads == ref.k_heads, n
        assert paged[b].topn_mass == pytest.approx(ref.topn_mass, abs=1e-6)


def test_max_seqs_bounds_the_work() -> None:
    impl, query, key, _keys, c = _case([5, 19, 8])
    inputs = paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=2)
    assert inputs is not None and inputs.query.shape[0] == 2


def test_wrong_layout_is_an_error_not_a_wrong_value() -> None:
    impl, query, key, _keys, c = _case([5, 19])
    with pytest.raises(paged_kc.PagedLayoutError, match=r"differs|no known layout"):
        paged_kc.kc_inputs(impl, query, key + 1.0, c.cache, c.meta, max_seqs=4)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("alibi_slopes", torch.ones(HQ)),
        ("logits_soft_cap", 30.0),
        ("kv_cache_dtype", "fp8"),
        ("attn_type", "encoder_only"),
    ],
)
def test_unsupported_attention_gives_no_kc(field: str, value: object) -> None:
    impl, query, key, _keys, c = _case([5])
    setattr(impl, field, value)
    assert paged_kc.kc_inputs(impl, query, key, c.cache, c.meta, max_seqs=4) is None
