"""GPU paths: CUDA-event timing, the device-side NaN flag, SDPA/flash on CUDA.

Marked ``gpu``: skipped without an NVIDIA GPU (tests/conftest.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kcops.kernels as kernels
from kcops.kernels import wire
from tests.unit.kernels.conftest import Listener, drain, text_ids, tiny_llama
from tests.unit.kernels.test_kc import brute_force

pytestmark = pytest.mark.gpu


def _cfg(**kw: Any) -> kernels.ProbeConfig:
    base: dict[str, Any] = {"flush_interval_ms": 60_000, "socket_path": "/nonexistent/p.sock"}
    base.update(kw)
    return kernels.ProbeConfig(**base)


def test_cuda_timing_is_deferred_to_flush(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    model = tiny_llama("sdpa").cuda()
    ids = text_ids(64).cuda()
    with torch.no_grad():
        ref = model(ids).logits
    probe = kernels.install(_cfg(sample_rate=1.0, socket_path=path))
    with torch.no_grad():
        got = model(ids).logits
    assert torch.equal(ref, got)
    assert probe.aggregator.hist[wire.ATTENTION_SECONDS].count == 0  # read at the flush only
    probe.flush()
    (frame,) = drain(sock)
    assert frame.histograms[wire.ATTENTION_SECONDS].count == 2
    assert sum(h.count for h in frame.kc_by_layer.values()) == 2
    assert frame.calls_by_layer == {"0": 1, "1": 1}


def test_device_nan_flag_counts_each_bad_call(listener: tuple[str, Listener]) -> None:
    path, sock = listener
    probe = kernels.install(_cfg(socket_path=path, integrations=("torch_sdpa",)))
    q = torch.randn(1, 2, 8, 16, device="cuda")
    bad = q.clone()
    bad[0, 0, 3, 0] = float("nan")
    for t in (q, bad, bad, q):
        torch.nn.functional.scaled_dot_product_attention(t, q, q)
    assert probe.aggregator.errors["nan"] == 0  # not synced on the hot path
    probe.flush()
    (frame,) = drain(sock)
    assert frame.errors["nan"] == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_sdpa_cuda_kc_matches_full_matrix(dtype: torch.dtype) -> None:
    probe = kernels.install(
        _cfg(sample_rate=1.0, rows="all", record=True, integrations=("torch_sdpa",))
    )
    q = torch.randn(1, 4, 32, 64, device="cuda", dtype=dtype)
    k = torch.randn(1, 4, 32, 64, device="cuda", dtype=dtype)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True)
    assert out.shape == q.shape
    scores = (q @ k.transpose(-1, -2)) * 64**-0.5
    mask = torch.ones(32, 32, dtype=torch.bool, device="cuda").tril()
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1, dtype=torch.float32)
    for _, row in probe.records:
        heads, union = brute_force(weights[0, :, row.position, : row.position + 1].cpu(), 4, 0.9)
        assert row.k_heads[0.9] == heads
        assert row.k_union[0.9] == union
