"""Top-N attention (issue 3 item 6): per-row selection, causal mask, equals full attention."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from kcops.kernels.topn import (
    TOPN_ATTENTION,
    TopNPolicy,
    register,
    topn_attention,
    topn_attention_forward,
    use_policy,
)


def _qkv(b: int = 2, h: int = 4, hkv: int = 2, q: int = 12, k: int = 12, d: int = 8):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, h, q, d, generator=g),
        torch.randn(b, hkv, k, d, generator=g),
        torch.randn(b, hkv, k, d, generator=g),
    )


def _full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    q_len, k_len = q.shape[2], k.shape[2]
    causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal).transpose(1, 2)


@pytest.mark.parametrize("q_len", [12, 1, 5])
def test_n_at_least_context_equals_full_attention(q_len: int) -> None:
    q, k, v = _qkv(q=q_len, k=12)
    out, _ = topn_attention(q, k, v, None, n=12)
    torch.testing.assert_close(out, _full(q, k, v), rtol=1e-5, atol=1e-5)
    out2, _ = topn_attention(q, k, v, None, n=1000)
    torch.testing.assert_close(out2, _full(q, k, v), rtol=1e-5, atol=1e-5)


def test_small_n_keeps_exactly_n_keys_per_row_and_respects_causality() -> None:
    q, k, v = _qkv(q=12, k=12)
    n = 4
    _, keep = topn_attention(q, k, v, None, n=n)
    counts = keep.sum(-1)  # (B, H, Q)
    allowed = torch.arange(1, 13)  # row t may see t+1 keys
    assert torch.equal(counts, torch.minimum(allowed, torch.tensor(n)).expand_as(counts))
    future = torch.ones(12, 12, dtype=torch.bool).triu(1)
    assert not (keep & future).any()


def test_selection_is_per_row_the_largest_scores() -> None:
    q, k, v = _qkv(b=1, h=2, hkv=2, q=6, k=6)
    n = 2
    _, keep = topn_attention(q, k, v, None, n=n)
    scores = q @ k.transpose(-1, -2)
    for h in range(2):
        for t in range(n, 6):
            row = scores[0, h, t, : t + 1]
            expected = set(row.topk(n).indices.tolist())
            assert set(keep[0, h, t].nonzero().flatten().tolist()) == expected


def test_sinks_and_recent_window_are_kept_on_top_of_n() -> None:
    q, k, v = _qkv(b=1, h=1, hkv=1, q=10, k=10)
    _, keep = topn_attention(q, k, v, None, n=2, sink_tokens=1, recent_tokens=2)
    last = keep[0, 0, 9]
    assert last[0] and last[8] and last[9]
    assert int(last.sum()) == 5  # 1 sink + 2 recent + 2 by score


def test_padding_mask_and_bool_float_masks_agree() -> None:
    q, k, v = _qkv(b=1, h=2, hkv=1, q=8, k=8)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    causal[:, :2] = False  # two left-padded keys
    as_float = torch.zeros(8, 8).masked_fill(~causal, torch.finfo(torch.float32).min)
    out_b, keep_b = topn_attention(q, k, v, causal[None, None], n=3)
    out_f, keep_f = topn_attention(q, k, v, as_float[None, None], n=3)
    torch.testing.assert_close(out_b, out_f)
    assert torch.equal(keep_b, keep_f)
    assert not keep_b[..., :2].any()
    assert torch.equal(out_b[0, :2], torch.zeros_like(out_b[0, :2]))  # fully masked rows


def test_policy_by_layer_and_dense_layers() -> None:
    p = TopNPolicy(top_n=32, top_n_by_layer={3: 8}, dense_layers=frozenset({0, 1}))
    assert p.n_for_layer(0) is None and p.n_for_layer(2) == 32 and p.n_for_layer(3) == 8
    assert TopNPolicy().n_for_layer(5) is None


@pytest.mark.slow
def test_forward_dispatch_dense_vs_topn_in_a_model() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    assert register() == TOPN_ATTENTION
    cfg = LlamaConfig(  # type: ignore[call-arg]
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=TOPN_ATTENTION,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    assert model.config._attn_implementation == TOPN_ATTENTION
    ref = LlamaForCausalLM(copy.deepcopy(cfg)).eval()
    ref.load_state_dict(model.state_dict())
    ref.set_attn_implementation("sdpa")
    ids = torch.randint(0, 64, (1, 40))
    with torch.inference_mode():
        dense = model(ids).logits
        torch.testing.assert_close(dense, ref(ids).logits, rtol=1e-5, atol=1e-5)
        with use_policy(TopNPolicy(top_n=64)):
            torch.testing.assert_close(model(ids).logits, dense, rtol=1e-5, atol=1e-5)
        with use_policy(TopNPolicy(top_n=2)):
            sparse = model(ids).logits
        assert (sparse - dense).abs().max() > 0  # random init: small but real differences
        with use_policy(TopNPolicy(top_n=2, dense_layers=frozenset({0, 1}))):
            torch.testing.assert_close(model(ids).logits, dense, rtol=1e-5, atol=1e-5)
        with use_policy(TopNPolicy(inject_nan=True)):
            assert torch.isnan(model(ids).logits).any()


def test_n_below_one_is_refused() -> None:
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="N >= 1"):
        topn_attention(q, k, v, None, n=0)


def test_forward_signature_returns_transformers_layout() -> None:
    q, k, v = _qkv(b=1, h=4, hkv=2, q=3, k=9)
    mod = torch.nn.Module()
    mod.layer_idx = 0  # type: ignore[assignment]
    mod.num_key_value_groups = 2  # type: ignore[assignment]
    with use_policy(TopNPolicy(top_n=2)):
        out, weights = topn_attention_forward(mod, q, k, v, None, scaling=8**-0.5)
    assert out.shape == (1, 3, 4, 8) and weights is None
