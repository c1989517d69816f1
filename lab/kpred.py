"""K_pred (docs/architecture.md#kc): the least context that keeps the model's greedy next token.

For a query position t (context = t + 1 tokens), K_pred is the least k on a
grid for which the model, seeing only k tokens, predicts the same greedy
token as with all of them:

- ``recency``: the k most recent tokens (t - k + 1 … t), run at their original
  positions (the same as masking the older ones out: they contribute nothing);
- ``top``: the current token plus the k - 1 tokens that the last prompt rows
  attended most (SnapKV scores summed over layers and KV heads), the others
  masked out by a 2-D attention mask, original positions kept.

The criterion is not monotonic in k (a prediction can come back and go again),
so the grid is scanned upwards and the first k that keeps the token wins — no
bisection. The full context is always on the grid, so K_pred exists.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, TypedDict

import torch

from kcops.kernels.kvkeep import capture_scores
from kcops.kernels.topn import DENSE, use_policy
from kcops.lab.sweep import last_only

if TYPE_CHECKING:
    from transformers import PreTrainedModel

VARIANTS = ("recency", "top")
SHORT_SHARE = 0.10  # the literature's "< 10% of the context"


def grid(context: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, 24, … (powers of two and their 1.5x) below ``context``,
    then ``context``."""
    out = {context}
    p = 1
    while p < context:
        out.add(p)
        if p * 3 // 2 < context:
            out.add(p * 3 // 2)
        p *= 2
    return sorted(out)


def _argmax_last(model: PreTrainedModel, ids: torch.Tensor, **kwargs: torch.Tensor) -> int:
    with torch.inference_mode(), use_policy(DENSE):
        out = model(input_ids=ids, **kwargs, **last_only(model))
        return int(out.logits[0, -1].float().argmax())


def _first_keeping(
    model: PreTrainedModel, t: int, want: int, keeps: Callable[[int], dict[str, torch.Tensor]]
) -> tuple[int, int]:
    """``(K_pred, want)``: the first k of the grid whose forward (``keeps(k)``: its inputs)
    gives the greedy token ``want``."""
    for k in grid(t + 1):
        if k == t + 1 or _argmax_last(model, **keeps(k)) == want:
            return k, want
    raise AssertionError("unreachable: the full context is on the grid")


def kpred_recency(model: PreTrainedModel, ids: Sequence[int]) -> tuple[int, int]:
    """``(K_pred, greedy token)`` for the last position of ``ids`` (recency variant)."""
    t = len(ids) - 1
    full = torch.tensor([list(ids)])

    def recent(k: int) -> dict[str, torch.Tensor]:  # the k most recent, at their positions
        return {"ids": full[:, t + 1 - k :], "position_ids": torch.arange(t + 1 - k, t + 1)[None]}

    return _first_keeping(model, t, _argmax_last(model, full), recent)


def kpred_top(model: PreTrainedModel, ids: Sequence[int]) -> tuple[int, int]:
    """``(K_pred, greedy token)`` for the last position (top-attended variant)."""
    t = len(ids) - 1
    full = torch.tensor([list(ids)])
    with torch.inference_mode(), use_policy(DENSE), capture_scores() as cap:
        want = int(model(input_ids=full, **last_only(model)).logits[0, -1].float().argmax())
    importance = sum(s[0].float().sum(0) for s in cap.scores.values())
    assert isinstance(importance, torch.Tensor)
    importance[t] = float("inf")  # the current token is always kept
    order = importance.argsort(descending=True)

    def top(k: int) -> dict[str, torch.Tensor]:
        mask = torch.zeros(1, t + 1, dtype=torch.long)
        mask[0, order[:k]] = 1
        return {"ids": full, "attention_mask": mask, "position_ids": torch.arange(t + 1)[None]}

    return _first_keeping(model, t, want, top)


@dataclass
class KpredRow:
    variant: str
    sequence: int
    position: int
    context: int
    k_pred: int

    @property
    def ratio(self) -> float:
        return self.k_pred / self.context


def positions(context: int, count: int) -> list[int]:
    """``count`` evenly spaced query positions in the second half of a sequence."""
    lo, hi = context // 2, context - 1
    if count <= 1:
        return [hi]
    return sorted({lo + round(i * (hi - lo) / (count - 1)) for i in range(count)})


def measure(
    model: PreTrainedModel,
    seqs: torch.Tensor,
    *,
    count: int,
    variants: Sequence[str],
    tick: Callable[[], object] | None = None,
) -> list[KpredRow]:
    rows: list[KpredRow] = []
    fns = {"recency": kpred_recency, "top": kpred_top}
    for s, seq in enumerate(seqs.tolist()):
        for pos in positions(len(seq), count):
            for v in variants:
                k, _ = fns[v](model, seq[: pos + 1])
                rows.append(KpredRow(v, s, pos, pos + 1, k))
                if tick is not None:
                    tick()
    return rows


class VariantSummary(TypedDict):
    tokens: int
    k_pred_median: float
    k_pred_p90: int
    ratio_median: float
    share_below_10pct: float
    histogram: dict[str, int]


class KpredDoc(TypedDict):
    """``kpred.json``: per-variant summaries and every row."""

    summary: dict[str, VariantSummary]
    rows: list[dict[str, object]]


def summary(rows: Sequence[KpredRow]) -> KpredDoc:
    """Per variant: quantiles of K_pred and of K_pred / context, share needing < 10%."""
    out: dict[str, VariantSummary] = {}
    for v in sorted({r.variant for r in rows}):
        mine = [r for r in rows if r.variant == v]
        ks = sorted(r.k_pred for r in mine)
        ratios = sorted(r.ratio for r in mine)
        out[v] = VariantSummary(
            tokens=len(mine),
            k_pred_median=statistics.median(ks),
            k_pred_p90=ks[min(len(ks) - 1, int(0.9 * len(ks)))],
            ratio_median=statistics.median(ratios),
            share_below_10pct=sum(r.ratio < SHORT_SHARE for r in mine) / len(mine),
            histogram={str(k): ks.count(k) for k in sorted(set(ks))},
        )
    return {"summary": out, "rows": [asdict(r) for r in rows]}
