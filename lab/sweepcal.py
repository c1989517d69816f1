"""``kc sweep``'s calibration of the live recommendation: the K(C) coverage of its N.

Attention mass and accuracy are different measures. The sweep knows which N keeps
accuracy (its recommendation); the agent knows, live, how K_p is distributed over
attention calls. The bridge: on the sweep's own corpus, per layer, every window row's
K_p (the last ``OBS_WINDOW`` prompt rows of each sequence; union over a KV group's query
heads, the largest group: the value the probe records for a call), for a grid of p; then
the call quantile q at which the live-style uniform N (the largest layer's q-quantile,
estimated from the probe's own buckets, :mod:`kcops.kcbudget`) equals the
recommended N. The agent configured with ``{p, quantile}`` then recommends, on live
traffic, the N that covers calls as the sweep's N covered its corpus.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict

from kcops.kcbudget import bucket_counts, matching_quantile, uniform_at
from kcops.kernels.wire import BUCKETS, KC_TOKENS

KC_BOUNDS = BUCKETS[KC_TOKENS]

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

P_GRID = (0.5, 0.8, 0.9, 0.95, 0.99)
PROBE_P = 0.9  # the probe's default p (kcops.kernels.config.ProbeConfig.p_values[0])
DENSE_FIRST = frozenset({0, 1})

# One p's match: the call quantile, how it matched, the live-style uniform N at 0.95.
Match = TypedDict("Match", {"quantile": float | None, "match": str, "uniform_n_at_0.95": float})


class LayerSet(TypedDict):
    dense_layers: list[int]
    by_p: dict[str, Match]


class Coverage(TypedDict):
    """:func:`coverage`'s answer (``recommendation.json``'s ``kc_coverage``)."""

    p: float
    quantile: float | None
    match: str | None
    n: int
    layers: str
    dense_layers: list[int]
    samples_per_layer: int
    by_p: dict[str, Match]
    by_layers: dict[str, LayerSet]


def measure_rows(
    model: PreTrainedModel, seqs: torch.Tensor, eval_tokens: int
) -> dict[int, dict[float, list[int]]]:
    """K_p rows per layer and p of one context's prefill (the sweep's own prefill, again:
    a resumed sweep may have measured every row without one)."""
    from kcops.lab.sweep import prefill

    return prefill(model, seqs, eval_tokens, p_grid=P_GRID).rows


def _by_p(
    rows: Mapping[int, Mapping[float, Sequence[int]]], used: Sequence[int], n: int
) -> dict[str, Match]:
    by_p: dict[str, Match] = {}
    for p in sorted({p for i in used for p in rows[i]}):
        hists = {str(i): bucket_counts(rows[i][p], KC_BOUNDS) for i in used}
        q, how = matching_quantile(n, hists, KC_BOUNDS)
        uniform = round(uniform_at(0.95, hists, KC_BOUNDS), 1)
        by_p[f"{p:g}"] = {"quantile": q, "match": how, "uniform_n_at_0.95": uniform}
    return by_p


def coverage(
    rows: Mapping[int, Mapping[float, Sequence[int]]],
    n: int,
    policy: str | None,
    probe_p: float = PROBE_P,
) -> Coverage:
    """The K(C) coverage that matches ``n``: per p of the grid, the call quantile at which
    the live-style uniform N equals ``n`` (over the non-dense layers when ``policy`` is
    ``dense_first``, else over all), and the entry for ``probe_p`` as ``p``/``quantile``.

    ``by_layers`` has the same for both layer sets (``all``; ``non_dense``: all but
    ``DENSE_FIRST``): the live recommendation takes its uniform N over the layers the
    engine budgets (the reference worker keeps 0 and 1 dense by default, whatever the
    sweep's policy), and its quantile must be matched over the same layers. Over all
    layers SmolLM2's layer 0 (K_0.9 ~ 0.9 of the context on every row) makes any N
    below it ``below_all``."""
    dense = DENSE_FIRST if policy == "dense_first" else frozenset()
    sets = {
        "all": sorted(rows),
        "non_dense": sorted(i for i in rows if i not in DENSE_FIRST),
    }
    by_layers: dict[str, LayerSet] = {
        name: {"dense_layers": sorted(DENSE_FIRST) if name == "non_dense" else [],
               "by_p": _by_p(rows, used, n)}
        for name, used in sets.items()
        if used
    }  # fmt: skip
    name = "non_dense" if dense else "all"
    used = sets[name]
    by_p = by_layers[name]["by_p"] if name in by_layers else {}
    main = by_p.get(f"{probe_p:g}")
    return {
        "p": probe_p,
        "quantile": main["quantile"] if main else None,
        "match": main["match"] if main else None,
        "n": n,
        "layers": name,
        "dense_layers": sorted(dense),
        "samples_per_layer": min(
            (len(rows[i][probe_p]) for i in used if probe_p in rows[i]), default=0
        ),
        "by_p": by_p,
        "by_layers": by_layers,
    }
