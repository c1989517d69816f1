"""K(C) for a few query rows of one attention call (docs/kc.md).

Never builds the full attention matrix (unless asked for every row): for the
chosen rows it recomputes softmax(q·Kᵀ·scale + mask) the way eager attention
does (scores in the model's dtype, softmax in float32), then

- K_p per query head: the least k whose k largest weights sum to >= p
  (cumulative sums in float64, so the comparison with p is exact enough to be
  reproducible);
- the union of those top-K_p key sets over the query heads of each KV group
  (GQA), and the row's ``k_union`` = the largest group union;
- the top-N mass per head, averaged over heads;
- κ = K_union / t, t = keys visible to the row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KcResult:
    """Per sampled row ``[B, R]`` (``k_heads`` ``[B, R, Hq]``, ``k_groups`` ``[B, R, Hkv]``).

    Tensors stay on the attention's device until :meth:`to_rows` is called.
    """

    positions: torch.Tensor
    visible: torch.Tensor
    valid: torch.Tensor
    k_union: dict[float, torch.Tensor]
    k_heads: dict[float, torch.Tensor]
    k_groups: dict[float, torch.Tensor]
    topn_mass: dict[int, torch.Tensor]

    def to_rows(self) -> list[KcRow]:
        """Move to the host (syncs on GPU) and flatten to one :class:`KcRow` per valid row."""
        pos = self.positions.tolist()
        vis = self.visible.tolist()
        valid = self.valid.tolist()
        ku = {p: t.tolist() for p, t in self.k_union.items()}
        kh = {p: t.tolist() for p, t in self.k_heads.items()}
        kg = {p: t.tolist() for p, t in self.k_groups.items()}
        tm = {n: t.tolist() for n, t in self.topn_mass.items()}
        rows: list[KcRow] = []
        for b in range(len(pos)):
            for r in range(len(pos[b])):
                if not valid[b][r]:
                    continue
                rows.append(
                    KcRow(
                        batch=b,
                        position=int(pos[b][r]),
                        visible=int(vis[b][r]),
                        k_union={p: int(v[b][r]) for p, v in ku.items()},
                        k_heads={p: [int(x) for x in v[b][r]] for p, v in kh.items()},
                        k_groups={p: [int(x) for x in v[b][r]] for p, v in kg.items()},
                        topn_mass={n: float(v[b][r]) for n, v in tm.items()},
                    )
                )
        return rows


@dataclass
class KcRow:
    """K(C) of one query row, on the host."""

    batch: int
    position: int
    visible: int
    k_union: dict[float, int]
    k_heads: dict[float, list[int]]
    k_groups: dict[float, list[int]]
    topn_mass: dict[int, float]

    def kappa(self, p: float) -> float:
        return self.k_union[p] / self.visible if self.visible else 0.0


def row_index(tq: int, rows: str | int, device: torch.device) -> torch.Tensor:
    """Query-row indices (0..tq-1) to recompute: ``last``, ``all`` or N evenly spaced
    rows ending with the last; built on ``device`` directly: no host-to-device copy (a
    sync on CUDA)."""
    if rows == "last" or tq <= 1:
        return torch.arange(tq - 1, tq, device=device)
    if rows == "all":
        return torch.arange(tq, device=device)
    n = min(int(rows), tq)
    if n == 1:
        return torch.arange(tq - 1, tq, device=device)
    # step (tq-1)/(n-1) >= 1, so the rounded positions are distinct
    return (
        (torch.arange(n, device=device, dtype=torch.float64) * ((tq - 1) / (n - 1))).round().long()
    )


def k_from_sorted(sorted_w: torch.Tensor, p: float) -> torch.Tensor:
    """K_p from weights sorted in descending order along the last dim (int64, >= 1)."""
    cs = sorted_w.double().cumsum(-1)
    k = (cs < p).sum(-1) + 1
    return k.clamp(max=sorted_w.shape[-1])


def _is_last_row(row_idx: torch.Tensor, tq: int) -> bool:
    """True when ``row_idx`` is the last query row: it sees every key (decode), no mask needed.
    Reads the index only when it lives on the CPU (no device sync)."""
    if row_idx.device.type != "cpu":
        return False
    return int(row_idx[0]) == tq - 1


def _row_mask(
    mask: torch.Tensor | None,
    b: int,
    row_idx: torch.Tensor,
    tq: int,
    tk: int,
    is_causal: bool,
    device: torch.device,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The additive mask of the chosen rows ``[B, 1|H, R, Tk]`` (or None) and the count
    of visible keys per row ``[B, R]``."""
    positions = row_idx + (tk - tq)
    if mask is None:
        if not is_causal or (len(row_idx) == 1 and tq >= 1 and _is_last_row(row_idx, tq)):
            return None, torch.full((b, len(row_idx)), tk, device=device, dtype=torch.long)
        keys = torch.arange(tk, device=device)
        hidden = keys[None, :] > positions[:, None]  # [R, Tk]
        add = torch.zeros((len(row_idx), tk), device=device).masked_fill(hidden, float("-inf"))
        vis = (~hidden).sum(-1).expand(b, -1)
        return add[None, None], vis
    m = mask[:b, :, :, :tk]
    m = m.index_select(2, row_idx) if m.shape[2] != 1 else m
    if m.dtype == torch.bool:
        vis = m.any(1).sum(-1) if m.shape[1] > 1 else m[:, 0].sum(-1)
        add = torch.zeros(m.shape, device=device).masked_fill(~m, float("-inf"))
        return add, vis.expand(b, len(row_idx))
    visible = m > torch.finfo(m.dtype).min / 2
    vis = visible[:, 0].sum(-1)
    return m, vis.expand(b, len(row_idx))


def row_weights(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    row_idx: torch.Tensor,
    is_causal: bool = True,
    max_batch: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention weights of the query rows ``row_idx`` recomputed as eager attention does:
    ``[B, R, Hq, Tk]`` float32, and the keys visible to each row ``[B, R]``. Shapes as in
    :func:`kc_rows`; at most ``max_batch`` batch entries."""
    b = min(query.shape[0], max_batch)
    hq, tq, d = query.shape[1], query.shape[2], query.shape[3]
    hkv, tk = key.shape[1], key.shape[2]
    g = hq // hkv
    if attention_mask is not None:
        while attention_mask.dim() < 4:
            attention_mask = attention_mask.unsqueeze(0)
    r = len(row_idx)
    q = query[:b].index_select(2, row_idx)  # [B, Hq, R, d]
    k = key[:b]
    scale = scaling if scaling is not None else d**-0.5
    if g > 1:
        # Group the query heads by KV head instead of repeating the keys: a
        # [B, Hq, Tk, d] copy of K is GiBs at long context on the engine's device.
        qg = q.reshape(b, hkv, g * r, d)
        scores = torch.matmul(qg, k.transpose(2, 3)).reshape(b, hq, r, tk) * scale
    else:
        scores = torch.matmul(q, k.transpose(2, 3)) * scale  # [B, Hq, R, Tk]
    add, visible = _row_mask(attention_mask, b, row_idx, tq, tk, is_causal, query.device)
    if add is not None:
        scores = scores + add.to(scores.dtype) if add.dtype != scores.dtype else scores + add
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return weights.permute(0, 2, 1, 3), visible  # [B, R, Hq, Tk]


def kc_rows(
    query: torch.Tensor,
    key: torch.Tensor,
    *,
    attention_mask: torch.Tensor | None,
    scaling: float | None,
    rows: str | int,
    p_values: tuple[float, ...],
    topn: tuple[int, ...],
    is_causal: bool = True,
    max_batch: int = 4,
) -> KcResult:
    """K(C) of the chosen rows of one call.

    ``query`` ``[B, Hq, Tq, d]``, ``key`` ``[B, Hkv, Tk, d]`` (KV not yet repeated
    for GQA; Hq must be a multiple of Hkv), ``attention_mask`` additive float or
    boolean (True = attend) broadcastable to ``[B, 1|Hq, Tq, Tk]``.
    """
    with torch.no_grad():
        tq = query.shape[2]
        hkv, tk = key.shape[1], key.shape[2]
        device = query.device
        row_idx = row_index(tq, rows, device)
        weights, visible = row_weights(
            query,
            key,
            attention_mask=attention_mask,
            scaling=scaling,
            row_idx=row_idx,
            is_causal=is_causal,
            max_batch=max_batch,
        )
        b, r, hq = weights.shape[0], weights.shape[1], weights.shape[2]
        g = hq // hkv
        # A fully masked row is NaN under -inf masks but uniform under finfo.min
        # masks (HF eager): it has no visible key either way.
        valid = ~torch.isnan(weights).any(-1).any(-1) & (visible > 0)
        sorted_w, order = weights.sort(dim=-1, descending=True)
        ranks = torch.arange(tk, device=device)
        vis_clamp = visible[:, :, None].clamp(min=1)
        k_union: dict[float, torch.Tensor] = {}
        k_heads: dict[float, torch.Tensor] = {}
        k_groups: dict[float, torch.Tensor] = {}
        for p in p_values:
            kh = torch.minimum(k_from_sorted(sorted_w, p), vis_clamp)  # [B, R, Hq]
            keep_sorted = ranks < kh[..., None]
            keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
            kg = keep.view(b, r, hkv, g, tk).any(3).sum(-1)  # [B, R, Hkv]
            k_heads[p] = kh
            k_groups[p] = kg
            k_union[p] = kg.max(-1).values
        topn_mass = {n: sorted_w[..., : min(n, tk)].sum(-1).mean(-1) for n in topn}
        positions = (row_idx + (tk - tq))[None, :].expand(b, r)
        return KcResult(positions, visible, valid, k_union, k_heads, k_groups, topn_mass)
