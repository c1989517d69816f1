"""Top-N KV retention: keep in the KV cache only what an attention budget N can use.

After a prompt is prefilled with full attention, each layer with a budget keeps,
per KV head, ``N`` keys: a few *sink* tokens (the first ones), a *recent*
window (the last ones), and the *heavy hitters* — the keys that the last
``OBS_WINDOW`` prompt rows attended most (SnapKV), summed over the query heads
of the KV group. While decoding, each new row's attention weights are added to
those scores (H2O's accumulated attention) and after every step a layer is cut
back to N (:func:`evict`: the layers of one budget and shape in one batched
selection, so the cut costs a few tensor operations per step, not per layer).
So between steps a compressed layer holds at most N keys per KV head, its KV
bytes scale with N, not with the context, and a decode step reads N + 1 keys
(the kept ones and its own).

The cache stays a transformers ``DynamicCache``; its layers become
:class:`KeptLayer`, which report the *logical* sequence length (every token
seen, kept or not) so that positions and 2-D masks stay those of the full
sequence. A compressed layer carries its own per-key validity (left padding
of a batch, rows shorter than N) and attends through :func:`kept_attention`,
never through the full-width mask.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from transformers.cache_utils import DynamicLayer

if TYPE_CHECKING:
    from transformers import Cache, PretrainedConfig

OBS_WINDOW = 32  # prompt rows whose attention picks the heavy hitters (SnapKV)
MAX_SINKS = 4


def split_budget(n: int) -> tuple[int, int]:
    """``(sinks, recent)`` carved out of a budget of ``n`` keys; the rest are heavy hitters."""
    if n < 1:
        raise ValueError(f"a KV budget needs N >= 1, got {n}")
    return min(MAX_SINKS, n // 8), n // 4


class KeptLayer(DynamicLayer):
    """A cache layer that may hold a subset of the keys; lengths stay logical.

    ``valid`` / ``score`` ((B, Hkv, T) each) are None for a layer kept whole."""

    def __init__(self) -> None:
        super().__init__()
        self.logical = 0
        self.heavy = True  # False: sinks + recent window only (StreamingLLM)
        self.valid: torch.Tensor | None = None
        self.score: torch.Tensor | None = None
        # Each slot's position, for a layer whose rows have no padding (``kc sweep``):
        # with it, a decode step's cut moves the new key into the evicted one's slot
        # instead of re-gathering the layer (:func:`evict`); slots leave position order.
        self.pos: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = super().update(key_states, value_states)
        new = key_states.shape[-2]
        self.logical += new
        if self.valid is not None and self.score is not None:
            b, h = self.valid.shape[:2]
            self.valid = torch.cat([self.valid, self.valid.new_ones(b, h, new)], dim=-1)
            self.score = torch.cat([self.score, self.score.new_zeros(b, h, new)], dim=-1)
            if self.pos is not None:
                at = torch.arange(self.logical - new, self.logical).expand(b, h, new)
                self.pos = torch.cat([self.pos, at], dim=-1)
        return out

    def get_seq_length(self) -> int:
        return self.logical

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.logical + query_length, 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        if self.valid is not None and self.score is not None:
            self.valid = self.valid.index_select(0, indices)
            self.score = self.score.index_select(0, indices)
            if self.pos is not None:
                self.pos = self.pos.index_select(0, indices)

    @property
    def nbytes(self) -> int:
        if not self.is_initialized or self.keys is None or self.values is None:
            return 0
        return int(self.keys.nbytes + self.values.nbytes)

    def compress(self, n: int) -> None:
        """Cut this layer to ``n`` keys per (row, KV head): sinks, recent, then by score."""
        if self.valid is None or self.score is None or self.keys is None or self.values is None:
            raise ValueError("compress needs scores: prefill the layer under capture_scores()")
        if self.keys.shape[-2] <= n:
            return
        if self.pos is not None:
            self.keys, self.values, self.valid, self.score, self.pos = select_by_pos(
                self.keys, self.values, self.valid, self.score, self.pos, n, self.logical,
                heavy=self.heavy,
            )  # fmt: skip
            return
        self.keys, self.values, self.valid, self.score = select(
            self.keys, self.values, self.valid, self.score, n, heavy=self.heavy
        )


def select(
    keys: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    score: torch.Tensor,
    n: int,
    *,
    heavy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep ``n`` keys along the key axis of keys/values (..., T, D) and valid/score
    (..., T), in position order: the sinks and the recent window among the valid keys,
    then the best scored (``heavy`` False: sinks + recent only). Needs T >= n."""
    sinks, recent = split_budget(n)
    if not heavy:
        recent = n - sinks
    rank = valid.long().cumsum(-1)
    total = rank[..., -1:]
    forced = valid & ((rank <= sinks) | (rank > total - recent))
    pri = score.float().masked_fill(~valid, float("-inf")).masked_fill(forced, float("inf"))
    idx = pri.topk(n, dim=-1).indices.sort(dim=-1).values
    return _take(keys, idx), _take(values, idx), valid.gather(-1, idx), score.gather(-1, idx)


def _priority(
    valid: torch.Tensor, score: torch.Tensor, pos: torch.Tensor, n: int, logical: int, heavy: bool
) -> torch.Tensor:
    """:func:`select`'s priorities from slot positions (rows without padding): the
    sinks are positions below ``sinks``, the recent window the last ``recent`` of
    ``logical`` positions; both +inf, invalid slots -inf, the rest their score."""
    sinks, recent = split_budget(n)
    if not heavy:
        recent = n - sinks
    forced = valid & ((pos < sinks) | (pos >= logical - recent))
    return score.float().masked_fill(~valid, float("-inf")).masked_fill(forced, float("inf"))


def select_by_pos(
    keys: torch.Tensor,
    values: torch.Tensor,
    valid: torch.Tensor,
    score: torch.Tensor,
    pos: torch.Tensor,
    n: int,
    logical: int,
    *,
    heavy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`select` for slots that carry their positions (any slot order)."""
    pri = _priority(valid, score, pos, n, logical, heavy)
    idx = pri.topk(n, dim=-1).indices.sort(dim=-1).values
    return (
        _take(keys, idx),
        _take(values, idx),
        valid.gather(-1, idx),
        score.gather(-1, idx),
        pos.gather(-1, idx),
    )


def drop_one(layer: KeptLayer, n: int) -> None:
    """A decode step's cut of a layer holding ``n + 1`` keys: the lowest-priority slot
    (the one :func:`select` would drop) takes the newest key, and the layer ends at
    ``n`` slots (a view): no re-gather of the layer's keys and values."""
    assert layer.keys is not None and layer.values is not None
    assert layer.valid is not None and layer.score is not None and layer.pos is not None
    pri = _priority(layer.valid, layer.score, layer.pos, n, layer.logical, layer.heavy)
    victim = pri.argmin(dim=-1, keepdim=True)  # (B, Hkv, 1)
    for name in ("valid", "score", "pos"):
        t = getattr(layer, name)
        t.scatter_(-1, victim, t[..., -1:])
        setattr(layer, name, t[..., :n])
    d = layer.keys.shape[-1]
    at = victim[..., None].expand(*victim.shape, d)
    for name in ("keys", "values"):
        t = getattr(layer, name)
        t.scatter_(-2, at, t[..., -1:, :])
        setattr(layer, name, t[..., :n, :])


def _take(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x.gather(-2, idx[..., None].expand(..., D))`` as one row ``index_select`` of the
    flattened tensor: on a CPU ten times faster than gather with an expanded index."""
    t, d = x.shape[-2], x.shape[-1]
    base = torch.arange(idx[..., 0].numel(), device=idx.device).reshape(idx.shape[:-1]) * t
    flat = x.reshape(-1, d).index_select(0, (base[..., None] + idx).reshape(-1))
    return flat.reshape(*idx.shape, d)


def evict(layers: Sequence[object], budgets: Sequence[int | None]) -> None:
    """After a decode step: cut every compressed layer holding more than its budget back
    to it (H2O; ``budgets[i]`` None: layer i stays whole). A lowered budget
    (``lower_topn``) is followed at once. Layers of one budget and shape are cut in one
    batched :func:`select` (a CPU step would otherwise pay a dozen small operations
    per layer)."""
    groups: dict[tuple[int, bool, tuple[int, ...], torch.dtype], list[KeptLayer]] = {}
    for layer, n in zip(layers, budgets, strict=True):
        if not isinstance(layer, KeptLayer) or layer.score is None or n is None:
            continue
        if layer.pos is not None and layer.keys is not None and layer.keys.shape[-2] == n + 1:
            drop_one(layer, n)  # a step's cut: one slot, no gather
            continue
        if layer.pos is not None:
            layer.compress(n)
            continue
        if layer.keys is not None and layer.keys.shape[-2] > n:
            shape = (n, layer.heavy, tuple(layer.keys.shape), layer.keys.dtype)
            groups.setdefault(shape, []).append(layer)
    for (n, heavy, *_), group in groups.items():
        if len(group) == 1:
            group[0].compress(n)
            continue
        keys, values, valid, score = (
            torch.stack([getattr(layer, name) for layer in group])
            for name in ("keys", "values", "valid", "score")
        )
        cut = select(keys, values, valid, score, n, heavy=heavy)
        for g, layer in enumerate(group):
            layer.keys, layer.values, layer.valid, layer.score = (t[g] for t in cut)


def kept_cache(config: PretrainedConfig, layers: int) -> Any:  # its layers are KeptLayer
    """A ``DynamicCache`` whose layers are :class:`KeptLayer`."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    cache.layers = [KeptLayer() for _ in range(layers)]
    return cache


@dataclass
class LayerKV:
    """One request's KV of one layer: keys/values (Hkv, T, D); valid/score (Hkv, T) or None."""

    keys: torch.Tensor
    values: torch.Tensor
    valid: torch.Tensor | None
    score: torch.Tensor | None
    logical: int

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)


def cache_nbytes(cache: Cache) -> int:
    return sum(int(getattr(layer, "nbytes", 0)) for layer in cache.layers)


# -- scores while prefilling ---------------------------------------------------
@dataclass
class Capture:
    """Per layer: key scores (B, Hkv, K); with ``with_kp``, the layer's K_p (p =
    ``KP_MASS``, :func:`group_kp`: union over each KV group's query heads, median over
    the window's rows and the groups), for per-layer budgets."""

    scores: dict[int, torch.Tensor] = field(default_factory=dict)
    kp: dict[int, float] = field(default_factory=dict)
    with_kp: bool = False
    # ``kc sweep``'s calibration: per layer and p, every window row's K_p as the probe
    # measures a call's (row_kps)
    p_grid: tuple[float, ...] = ()
    rows: dict[int, dict[float, list[int]]] = field(default_factory=dict)


KP_MASS = 0.9
_CAPTURE: contextvars.ContextVar[Capture | None] = contextvars.ContextVar(
    "kcops_kv_capture", default=None
)


@contextlib.contextmanager
def capture_scores(*, with_kp: bool = False, p_grid: tuple[float, ...] = ()) -> Iterator[Capture]:
    """Inside the block, attention calls record per-layer key scores (and K_p)."""
    cap = Capture(with_kp=with_kp, p_grid=p_grid)
    token = _CAPTURE.set(cap)
    try:
        yield cap
    finally:
        _CAPTURE.reset(token)


def record_scores(
    layer: int, query: torch.Tensor, key: torch.Tensor, scaling: float | None
) -> None:
    """SnapKV scores: attention of the last ``OBS_WINDOW`` query rows, summed over rows
    and over the query heads of each KV group. Causal, queries at the last positions."""
    cap = _CAPTURE.get()
    if cap is None:
        return
    _b, h, q_len, d = query.shape
    hkv, k_len = key.shape[1], key.shape[-2]
    w = min(OBS_WINDOW, q_len)
    q = query[:, :, -w:].float().reshape(_b, hkv, (h // hkv) * w, d)
    s = torch.matmul(q, key.float().transpose(-1, -2)) * (scaling if scaling else d**-0.5)
    q_pos = torch.arange(k_len - w, k_len, device=query.device).repeat(h // hkv)
    causal = torch.arange(k_len, device=query.device)[None, :] <= q_pos[:, None]
    s = s.masked_fill(~causal, float("-inf"))
    weights = torch.softmax(s, dim=-1)
    cap.scores[layer] = weights.sum(dim=2)
    if cap.with_kp:
        cap.kp[layer] = group_kp(weights, h // hkv, w)
    if cap.p_grid:
        cap.rows[layer] = row_kps(weights, h // hkv, w, cap.p_grid)


def group_unions(weights: torch.Tensor, g: int, w: int, p: float) -> torch.Tensor:
    """Per KV group and row, the size of the union of its ``g`` query heads' top-K_p key
    sets (docs/kc.md): the keys one KV head's budget must hold for all of them.
    ``weights`` (B, Hkv, g * w, T), head-major, rows at the last ``w`` positions (causal);
    the result is (B, Hkv, w)."""
    from kcops.kernels.kc import k_from_sorted

    sorted_w, order = weights.sort(dim=-1, descending=True)
    b, hkv, _, t = weights.shape
    visible = torch.arange(t - w + 1, t + 1, device=weights.device).repeat(g)  # causal
    k = torch.minimum(k_from_sorted(sorted_w, p), visible)  # (B, Hkv, g * w)
    keep_sorted = torch.arange(t, device=weights.device) < k[..., None]
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    return keep.view(b, hkv, g, w, t).any(2).sum(-1)


def group_kp(weights: torch.Tensor, g: int, w: int) -> float:
    """Median over rows and KV groups of the group union's K_p (p = ``KP_MASS``)."""
    return float(group_unions(weights, g, w, KP_MASS).float().median())


def row_kps(
    weights: torch.Tensor, g: int, w: int, p_grid: Sequence[float]
) -> dict[float, list[int]]:
    """Per p, each row's K_p as the probe records it: the largest KV group's union."""
    return {
        p: [int(x) for x in group_unions(weights, g, w, p).amax(1).flatten().tolist()]
        for p in p_grid
    }


# -- attention over a compressed layer ---------------------------------------------
_KEPT: contextvars.ContextVar[Cache | None] = contextvars.ContextVar(
    "kcops_kept_cache", default=None
)


@contextlib.contextmanager
def use_kept(cache: Cache | None) -> Iterator[None]:
    """Attention calls inside the block read compressed layers of ``cache``."""
    token = _KEPT.set(cache)
    try:
        yield
    finally:
        _KEPT.reset(token)


class GroupAttend(Protocol):
    """A cache layer that attends for several groups of rows itself."""

    def attend(self, query: torch.Tensor, scaling: float | None) -> torch.Tensor: ...


def kept_group(layer: int) -> GroupAttend | None:
    """Layer ``layer`` of the cache in use when it attends for several groups of rows
    itself (``kc sweep``'s batched budgets: it has ``attend(query, scaling)``), else None."""
    cache = _KEPT.get()
    if cache is None or layer >= len(cache.layers):
        return None
    obj = cache.layers[layer]
    return cast(GroupAttend, obj) if hasattr(obj, "attend") else None


def kept_layer(layer: int) -> KeptLayer | None:
    """The compressed layer ``layer`` of the cache in use, or None (attend as usual)."""
    cache = _KEPT.get()
    if cache is None or layer >= len(cache.layers):
        return None
    obj = cache.layers[layer]
    return obj if isinstance(obj, KeptLayer) and obj.score is not None else None


def kept_attention(
    kept: KeptLayer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """Decode rows (Q = 1) over a compressed layer; adds the weights to the key scores.

    Returns (B, Q, H, D) like transformers' attention functions."""
    if kept.valid is None or kept.score is None:
        raise ValueError("kept_attention needs a compressed layer")
    b, h, q_len, d = query.shape
    hkv = key.shape[1]
    g = h // hkv
    if q_len != 1:
        raise ValueError(f"a compressed layer attends decode rows only (Q = 1), got Q = {q_len}")
    q = query.reshape(b, hkv, g, d)
    s = torch.matmul(q, key.transpose(-1, -2)) * (scaling if scaling else d**-0.5)
    s = s.masked_fill(~kept.valid[:, :, None, :], float("-inf"))
    w = torch.softmax(s.float(), dim=-1)
    kept.score = kept.score + w.sum(dim=2)
    out = torch.matmul(w.to(value.dtype), value)  # (B, Hkv, g, D)
    return out.reshape(b, h, 1, d).transpose(1, 2)


def compress_request(
    keys: torch.Tensor, values: torch.Tensor, score: torch.Tensor | None, n: int | None
) -> LayerKV:
    """One prefilled request's layer (Hkv, T, D), cut to ``n`` keys per KV head by
    ``score`` (Hkv, T) or (1, Hkv, T); ``n`` None keeps the layer whole (dense)."""
    logical = keys.shape[-2]
    if n is None or score is None:
        return LayerKV(keys, values, None, None, logical)
    layer = KeptLayer()
    layer.update(keys[None], values[None])
    layer.valid = torch.ones(keys.shape[:2], dtype=torch.bool)[None]
    layer.score = score.reshape(1, *keys.shape[:2]).float()
    layer.compress(n)
    assert layer.keys is not None and layer.values is not None
    return LayerKV(layer.keys[0], layer.values[0], layer.valid[0], layer.score[0], logical)
