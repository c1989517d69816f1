"""Attention maps of sampled query rows, per layer, for the pictures of ``kc report``.

One forward pass with the ``kcops_maps`` attention function (transformers' SDPA,
plus a recording of a few rows): for each layer, the weights of the sampled
query rows recomputed as eager attention does (kcops.kernels.kc.row_weights),
averaged over the heads, and the row's K_p (union over the heads of a KV group,
as ``kc measure`` reports it). Rows are evenly spaced, the last one included.

Saved as ``attention.npz`` next to ``measure.json`` by ``kc measure --out``:
``weights`` [layers, rows, T] float32 (zero beyond a row's position),
``positions`` [rows], ``kp`` [layers, rows], ``p`` (the mass level).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from kcops.kernels.kc import k_from_sorted, row_index, row_weights
from kcops.kernels.topn import register_attention

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MAPS_ATTENTION = "kcops_maps"
MAPS_FILE = "attention.npz"


@dataclass
class AttentionMaps:
    positions: np.ndarray  # [R] query positions
    weights: np.ndarray  # [L, R, T] head-mean weights
    kp: np.ndarray  # [L, R] K_p (union over the heads of a KV group)
    p: float

    def save(self, folder: Path) -> Path:
        path = folder / MAPS_FILE
        np.savez_compressed(
            path, positions=self.positions, weights=self.weights, kp=self.kp, p=np.float64(self.p)
        )
        return path

    @classmethod
    def load(cls, path: Path) -> AttentionMaps:
        with np.load(path) as z:
            return cls(z["positions"], z["weights"], z["kp"], float(z["p"]))


@dataclass
class _Recording:
    rows: int
    p: float
    weights: dict[int, torch.Tensor] = field(default_factory=dict)
    kp: dict[int, torch.Tensor] = field(default_factory=dict)
    positions: torch.Tensor | None = None


_REC: contextvars.ContextVar[_Recording | None] = contextvars.ContextVar(
    "kcops_maps_recording", default=None
)


def _kp_union(weights: torch.Tensor, hkv: int, p: float) -> torch.Tensor:
    """K_p of each row ``[R]`` from its weights ``[R, Hq, T]``: the largest union over the
    KV groups of the heads' top-K_p key sets."""
    r, hq, t = weights.shape
    sorted_w, order = weights.sort(dim=-1, descending=True)
    kh = k_from_sorted(sorted_w, p)  # [R, Hq]
    keep_sorted = torch.arange(t)[None, None, :] < kh[..., None]
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return keep.view(r, hkv, hq // hkv, t).any(2).sum(-1).max(-1).values


def maps_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """SDPA attention; inside :func:`recording`, also records the sampled rows (batch 0)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    rec = _REC.get()
    if rec is not None:
        layer = int(getattr(module, "layer_idx", 0) or 0)
        row_idx = row_index(query.shape[2], rec.rows, query.device)
        scaling = kwargs.get("scaling")
        w, _visible = row_weights(
            query,
            key,
            attention_mask=attention_mask,
            scaling=float(scaling) if scaling is not None else None,
            row_idx=row_idx,
            max_batch=1,
        )
        w = torch.nan_to_num(w[0], nan=0.0)  # [R, Hq, T]
        rec.weights[layer] = w.mean(1)
        rec.kp[layer] = _kp_union(w, key.shape[1], rec.p)
        rec.positions = row_idx + (key.shape[2] - query.shape[2])
    return out, None


@contextlib.contextmanager
def recording(rows: int, p: float) -> Iterator[_Recording]:
    rec = _Recording(rows, p)
    token = _REC.set(rec)
    try:
        yield rec
    finally:
        _REC.reset(token)


def register() -> str:
    """Register ``kcops_maps`` (see :func:`kcops.kernels.topn.register_attention`)."""
    return register_attention(MAPS_ATTENTION, maps_attention_forward)


def capture(
    model: PreTrainedModel, input_ids: torch.Tensor, *, rows: int, p: float
) -> AttentionMaps:
    """One forward pass of ``input_ids`` [1, T] recording ``rows`` query rows per layer.

    The model's attention implementation is switched to ``kcops_maps`` for the pass
    and restored after it."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = register()
    try:
        with torch.no_grad(), recording(rows, p) as rec:
            model(input_ids[:1])
    finally:
        config._attn_implementation = before
    if not rec.weights or rec.positions is None:
        raise ValueError("the model made no attention call through kcops_maps")
    layers = sorted(rec.weights)
    return AttentionMaps(
        positions=rec.positions.cpu().numpy(),
        weights=torch.stack([rec.weights[i] for i in layers]).cpu().numpy(),
        kp=torch.stack([rec.kp[i] for i in layers]).cpu().numpy(),
        p=p,
    )
