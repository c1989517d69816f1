"""``kc_live``: per-layer budgets re-split while decoding, from what the decode rows attend.

Every decode step, each compressed layer's new rows attend over the keys the layer
kept (N + 1 of them). Two figures come out of those weights, per layer:

- **edge mass**: the attention mass per key (mean over query heads, rows and KV
  heads) on the keys next in line for eviction: the ``max(1, heavy // EDGE_SHARE)``
  heavy hitters with the lowest accumulated (H2O) score. It is the slope of the
  layer's mass-vs-keys curve at its budget: what one key more or less is worth to
  the rows being decoded now. A layer cut to N cannot show the mass on the keys it
  dropped, but the mass its weakest kept keys still draw is the best observable
  guess of it (the dropped keys were ranked just below them);
- **kept K_0.9**: the K_0.9 of the row's weights over the kept keys (mean over the
  query heads of a KV group). It is capped at N + 1, so it says how much of its
  budget a layer uses, not how much it would want: evidence, not the control.

A running mean (EMA, ``ALPHA``) of the edge mass per layer drives the split:
every ``EVERY`` steps the same total (N x compressed layers) is re-split in
proportion to ``budget x (edge / mean edge)`` (:func:`resplit`), so a layer whose
weakest keys still draw more than the average gains keys and one whose weakest
keys draw nothing gives them up; at the fixed point every layer's edge keys are
worth the same (least mass lost for the total). Kept keys that were evicted are
gone, so a layer can grow by only one key a step (its new token): growth is
limited to ``EVERY`` keys a re-split and the shrinking layers give up exactly what
the growing ones gain, so the keys held never exceed the total. The split starts
uniform (the prefill's rows, which ``per_layer`` uses, are not the decode rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from kcops.kernels.kc import k_from_sorted
from kcops.kernels.kvkeep import split_budget

if TYPE_CHECKING:
    from kcops.lab.sweepbatch import GroupedLayer

EVERY = 4  # decode steps between re-splits (growth: at most one key a step)
ALPHA = 0.25  # weight of a new step's edge mass in the running mean
EDGE_SHARE = 8  # the edge: the lowest-scored 1/EDGE_SHARE of a layer's heavy hitters
KP_MASS = 0.9


def edge_mass(
    mass: torch.Tensor, valid: torch.Tensor, score: torch.Tensor, n: int, heads_per_group: int
) -> float | None:
    """Mean mass per key per query head on the lowest-scored heavy hitters of a layer cut
    to ``n``. ``mass`` (B, Hkv, T): this step's weights summed over each KV group's query
    heads; ``valid``/``score`` (B, Hkv, T) as the layer holds them (score updated). None
    when the layer has no heavy hitter (a budget of sinks + recent only)."""
    sinks, recent = split_budget(n)
    rank = valid.long().cumsum(-1)
    total = rank[..., -1:]
    forced = (rank <= sinks) | (rank > total - recent)
    cand = valid & ~forced
    heavy = int(cand.sum(-1).min())
    if heavy < 1:
        return None
    m = max(1, min(heavy, (n - sinks - recent) // EDGE_SHARE))
    pri = score.float().masked_fill(~cand, float("inf"))
    idx = pri.topk(m, dim=-1, largest=False).indices
    return float(mass.float().gather(-1, idx).mean()) / heads_per_group


def kept_kp(mass: torch.Tensor, valid: torch.Tensor, heads_per_group: int) -> float:
    """K_0.9 of the step's weights over the kept keys (KV group mean), mean over rows."""
    w = (mass.float() / heads_per_group).masked_fill(~valid, 0.0)
    return float(k_from_sorted(w.sort(-1, descending=True).values, KP_MASS).float().mean())


def resplit(
    budgets: Sequence[int],
    edge: Sequence[float | None],
    total: int,
    cap: int,
    limit: int,
) -> list[int]:
    """The next split: target ``share_budget(total, budget x edge / mean edge, cap)``,
    approached by at most ``limit`` keys of growth per layer; the layers that shrink
    give up exactly what the others gain (largest wanted cut first), so the sum stays
    ``total`` and each layer stays in [1, cap]. A layer with no measurement keeps its
    relative weight."""
    from kcops.lab.sweep import share_budget

    seen = [e for e in edge if e is not None]
    if not seen or max(seen) <= 0.0:
        return list(budgets)
    mean = sum(seen) / len(seen)
    floor = mean * 1e-3  # a layer whose edge drew nothing still keeps a share to shrink from
    rel = [1.0 if e is None else max(e, floor) / mean for e in edge]
    target = share_budget(total, [b * r for b, r in zip(budgets, rel, strict=True)], cap)
    gain = [min(max(t - b, 0), limit) for t, b in zip(target, budgets, strict=True)]
    want_cut = [max(b - t, 0) for t, b in zip(target, budgets, strict=True)]
    need = sum(gain)
    cut = [0] * len(budgets)
    if need:
        scale = need / sum(want_cut)
        cut = [int(w * scale) for w in want_cut]
        for i in sorted(range(len(budgets)), key=lambda i: want_cut[i] - cut[i], reverse=True):
            if sum(cut) >= need:
                break
            if cut[i] < want_cut[i]:
                cut[i] += 1
    return [b + g - c for b, g, c in zip(budgets, gain, cut, strict=True)]


@dataclass
class LiveBudget:
    """One ``kc_live`` row's per-layer budgets while it decodes (None: a layer kept whole)."""

    budgets: list[int | None]
    cap: int
    every: int = EVERY
    alpha: float = ALPHA
    edge: list[float | None] = field(default_factory=list)
    kp: list[float | None] = field(default_factory=list)
    trace: list[list[int | None]] = field(default_factory=list)
    steps: int = 0

    def __post_init__(self) -> None:
        layers = len(self.budgets)
        self.edge = self.edge or [None] * layers
        self.kp = self.kp or [None] * layers
        self.total = sum(b for b in self.budgets if b is not None)
        self.trace = [list(self.budgets)]

    def observe(self, layer: int, edge: float | None, kp: float) -> None:
        if edge is not None:
            old = self.edge[layer]
            self.edge[layer] = edge if old is None else old + self.alpha * (edge - old)
        old_kp = self.kp[layer]
        self.kp[layer] = kp if old_kp is None else old_kp + self.alpha * (kp - old_kp)

    def step(self) -> list[int | None]:
        """After a step's observations: every ``every`` steps, the compressed layers'
        budgets re-split (:func:`resplit`); the budgets to evict to now."""
        self.steps += 1
        if self.steps % self.every:
            return self.budgets
        live = [i for i, b in enumerate(self.budgets) if b is not None]
        if len(live) > 1:
            new = resplit(
                [int(self.budgets[i] or 0) for i in live],
                [self.edge[i] for i in live],
                self.total,
                self.cap,
                self.every,
            )
            for i, b in zip(live, new, strict=True):
                self.budgets[i] = b
        self.trace.append(list(self.budgets))
        return self.budgets

    def evidence(self) -> dict[str, object]:
        return {
            "every": self.every,
            "budgets": self.trace,
            "edge_mass": self.edge,
            "kept_k0.9": self.kp,
        }


def observe_step(
    live: LiveBudget, layers: Sequence[GroupedLayer], x: int, heads_per_group: int
) -> None:
    """Feed ``live`` group ``x``'s weights of this step from each
    :class:`~kcops.lab.sweepbatch.GroupedLayer` (``mass[x]``, set by ``attend``)."""
    for i, layer in enumerate(layers):
        mass = layer.mass.pop(x, None)
        sub = layer.subs[x]
        n = live.budgets[i]
        if mass is None or n is None or sub.valid is None or sub.score is None:
            continue
        live.observe(
            i,
            edge_mass(mass, sub.valid, sub.score, n, heads_per_group),
            kept_kp(mass, sub.valid, heads_per_group),
        )
