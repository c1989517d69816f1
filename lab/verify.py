"""``kc verify``: attention approximations against full attention on a golden set.

Variants (all causal):

- ``full``: softmax attention itself (the control: zero error);
- ``topn:N``: per row and head, the N largest scores, renormalised;
- ``window:W:G``: the last W keys plus the first G (sliding window + global
  tokens, Longformer/BigBird style);
- ``performer:M``: FAVOR+ positive random features (M orthogonal Gaussian
  features, fixed seed): weights ∝ φ(q)·φ(k), the causal prefix form written
  out as a masked matrix so that its distribution can be compared.

Per layer, on the full model's own q, k, v (so that errors do not compound):
the relative error of the attention output ‖(A′ − A)V‖ / ‖AV‖ and the mean
KL(A ‖ A′) over rows and heads (A′ floored at ``KL_FLOOR`` where a variant drops
a key). Then the whole model runs with the variant in every layer and its
greedy tokens are compared with full attention's. A variant passes a task when
its largest per-layer relative error is within the task's threshold (code
analysis 1e-4, summarisation 1e-3).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypedDict

import torch

from kcops.kernels.topn import _allowed, register_attention
from kcops.lab.sweep import SweepError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

VERIFY_ATTENTION = "kcops_verify"
THRESHOLDS = {"code_analysis": 1e-4, "summarisation": 1e-3}
KL_FLOOR = 1e-12
PERFORMER_SEED = 20240601


@dataclass(frozen=True)
class Variant:
    kind: str  # full | topn | window | performer
    a: int = 0
    b: int = 0

    @property
    def name(self) -> str:
        if self.kind == "full":
            return "full"
        if self.kind == "window":
            return f"window:{self.a}:{self.b}"
        return f"{self.kind}:{self.a}"


def parse_variant(raw: str) -> Variant:
    parts = raw.strip().split(":")
    try:
        if parts == ["full"]:
            return Variant("full")
        if parts[0] in ("topn", "performer") and len(parts) == 2 and int(parts[1]) >= 1:
            return Variant(parts[0], int(parts[1]))
        if parts[0] == "window" and len(parts) == 3 and int(parts[1]) >= 1 and int(parts[2]) >= 0:
            return Variant("window", int(parts[1]), int(parts[2]))
    except ValueError:
        pass
    raise SweepError(
        f"variant {raw!r}: allowed full, topn:N, window:W:G, performer:M (N, W, M >= 1)"
    )


def _features(x: torch.Tensor, proj: torch.Tensor, stab: torch.Tensor) -> torch.Tensor:
    """FAVOR+ positive features exp(w·x − |x|²/2 − stab) / √M."""
    wx = torch.matmul(x, proj.T)
    return torch.exp(wx - (x * x).sum(-1, keepdim=True) / 2 - stab) / math.sqrt(proj.shape[0])


def _orthogonal_gaussian(m: int, d: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(PERFORMER_SEED)
    blocks = []
    for _ in range(-(-m // d)):
        q, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
        blocks.append(q.T)
    norms = torch.randn(m, d, generator=gen, dtype=torch.float64).norm(dim=-1)
    return (torch.cat(blocks)[:m] * norms[:, None]).float()


def weights(
    variant: Variant, q: torch.Tensor, k: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention weights (B, H, Q, K) of ``variant`` for float32 q (B,H,Q,D), k (B,H,K,D)."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    allowed = allowed.expand_as(scores)
    if variant.kind == "performer":
        d = q.shape[-1]
        proj = _orthogonal_gaussian(variant.a, d)
        r = scale**0.5  # q·k·scale = (q·√scale)·(k·√scale)
        qx = q * r
        q_stab = (torch.matmul(qx, proj.T) - (qx * qx).sum(-1, keepdim=True) / 2).amax(
            -1, keepdim=True
        )  # a per-row constant: cancels when the row is normalised
        qf = _features(qx, proj, q_stab)
        kx = k * r
        stab = (torch.matmul(kx, proj.T) - (kx * kx).sum(-1, keepdim=True) / 2).amax()
        kf = _features(kx, proj, stab)
        w = torch.matmul(qf, kf.transpose(-1, -2)).masked_fill(~allowed, 0.0)
        return w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    keep = allowed
    if variant.kind == "topn":
        kk = min(variant.a, scores.shape[-1])
        idx = scores.masked_fill(~allowed, float("-inf")).topk(kk, dim=-1).indices
        keep = torch.zeros_like(allowed).scatter_(-1, idx, True) & allowed
    elif variant.kind == "window":
        k_len, q_len = scores.shape[-1], scores.shape[-2]
        t = torch.arange(k_len - q_len, k_len)[:, None]
        j = torch.arange(k_len)[None, :]
        keep = allowed & ((j > t - variant.a) | (j < variant.b))
    w = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return torch.nan_to_num(w, nan=0.0)


@dataclass
class LayerError:
    num: float = 0.0  # sum of squared output differences
    den: float = 0.0  # sum of squared full outputs
    kl_sum: float = 0.0
    rows: int = 0

    @property
    def rel_error(self) -> float:
        return math.sqrt(self.num / self.den) if self.den > 0 else 0.0

    @property
    def kl(self) -> float:
        return self.kl_sum / self.rows if self.rows else 0.0


@dataclass
class _State:
    variant: Variant
    apply: bool  # True: the variant replaces attention; False: measure only
    errors: dict[int, LayerError] = field(default_factory=dict)


_STATE: contextvars.ContextVar[_State | None] = contextvars.ContextVar("kcops_verify", default=None)


@contextlib.contextmanager
def use_variant(variant: Variant, *, apply: bool) -> Iterator[dict[int, LayerError]]:
    state = _State(variant, apply)
    token = _STATE.set(state)
    try:
        yield state.errors
    finally:
        _STATE.reset(token)


def verify_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers attention function: full attention, measuring or applying a variant."""
    _b, h, q_len, d = query.shape
    groups = h // key.shape[1]
    k = key.repeat_interleave(groups, dim=1).float()
    v = value.repeat_interleave(groups, dim=1).float()
    q = query.float()
    scale = scaling if scaling is not None else d**-0.5
    allowed = _allowed(attention_mask, q_len, k.shape[-2], query.device)
    full_w = weights(Variant("full"), q, k, allowed, scale)
    out = torch.matmul(full_w, v)
    state = _STATE.get()
    if state is not None:
        var_w = weights(state.variant, q, k, allowed, scale)
        var_out = torch.matmul(var_w, v)
        if state.apply:
            out = var_out
        else:
            layer = int(getattr(module, "layer_idx", 0) or 0)
            err = state.errors.setdefault(layer, LayerError())
            err.num += float(((var_out - out) ** 2).sum())
            err.den += float((out**2).sum())
            kl = full_w * (full_w.clamp_min(KL_FLOOR).log() - var_w.clamp_min(KL_FLOOR).log())
            err.kl_sum += float(kl.sum())
            err.rows += int(full_w.shape[0] * full_w.shape[1] * full_w.shape[2])
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``kcops_verify`` (see :func:`kcops.kernels.topn.register_attention`)."""
    return register_attention(VERIFY_ATTENTION, verify_attention_forward)


class LayerLine(TypedDict):
    layer: int
    rel_error: float
    kl: float


# One variant's line of ``verify.json`` ("pass": task -> within its threshold).
VariantResult = TypedDict("VariantResult", {
    "variant": str, "max_rel_error": float, "mean_kl": float, "agreement": float,
    "pass": dict[str, bool], "layers": list[LayerLine],
})  # fmt: skip


class VerifyDoc(TypedDict):
    """``verify.json``: the thresholds and one result per variant."""

    thresholds: dict[str, float]
    results: list[VariantResult]


def verify(
    model: PreTrainedModel,
    seqs: torch.Tensor,
    variants: Sequence[Variant],
    tick: Callable[[], object] | None = None,
) -> list[VariantResult]:
    """One result per variant: per-layer errors, greedy agreement, pass/fail per task."""
    with torch.inference_mode():
        full_pred = model(input_ids=seqs).logits.argmax(-1)
    results: list[VariantResult] = []
    for variant in variants:
        with torch.inference_mode():
            with use_variant(variant, apply=False) as errors:
                model(input_ids=seqs)
            with use_variant(variant, apply=True):
                pred = model(input_ids=seqs).logits.argmax(-1)
        layers = [
            LayerLine(layer=i, rel_error=e.rel_error, kl=e.kl) for i, e in sorted(errors.items())
        ]
        worst = max((x["rel_error"] for x in layers), default=0.0)
        results.append({
            "variant": variant.name, "max_rel_error": worst,
            "mean_kl": sum(x["kl"] for x in layers) / max(1, len(layers)),
            "agreement": float((pred == full_pred).float().mean()),
            "pass": {task: worst <= t for task, t in THRESHOLDS.items()}, "layers": layers,
        })  # fmt: skip
        if tick is not None:
            tick()
    return results
