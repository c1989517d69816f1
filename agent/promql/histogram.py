"""histogram_quantile over classic (``le``-labelled) buckets, as Prometheus 2.x computes it."""

from __future__ import annotations

import math

from kcops.agent.promql.model import NAME, Elem, Labels, Vector
from kcops.agent.promql.rangefns import quantile_edge


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """``buckets``: (upper bound, cumulative count) pairs, any order."""
    edge = quantile_edge(q)
    if edge is not None:
        return edge
    buckets = sorted(buckets, key=lambda b: b[0])
    if not math.isinf(buckets[-1][0]) or buckets[-1][0] < 0:
        return math.nan
    # Coalesce buckets with the same bound (summing counts), then force monotonicity.
    merged: list[list[float]] = []
    for ub, count in buckets:
        if merged and merged[-1][0] == ub:
            merged[-1][1] += count
        else:
            merged.append([ub, count])
    top = -math.inf
    for pair in merged:
        if pair[1] > top:
            top = pair[1]
        elif pair[1] < top:
            pair[1] = top
    if len(merged) < 2:
        return math.nan
    observations = merged[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    # sort.Search over all but the +Inf bucket: first index with count >= rank.
    b = len(merged) - 1
    for i in range(len(merged) - 1):
        if merged[i][1] >= rank:
            b = i
            break
    if b == len(merged) - 1:
        return merged[-2][0]
    if b == 0 and merged[0][0] <= 0:
        return merged[0][0]
    start = 0.0
    end = merged[b][0]
    count = merged[b][1]
    if b > 0:
        start = merged[b - 1][0]
        count -= merged[b - 1][1]
        rank -= merged[b - 1][1]
    return start + (end - start) * (rank / count)


def _parse_le(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        low = text.strip().lower()
        if low in ("+inf", "inf"):
            return math.inf
        return None


def histogram_quantile(q: float, vec: Vector) -> Vector:
    # Buckets group by their labels without ``le`` *and* by metric name, so two
    # histograms that differ only in name are not merged (Prometheus #9910); the
    # result has neither, and the evaluator refuses duplicates as Prometheus does.
    groups: dict[tuple[Labels, str], list[tuple[float, float]]] = {}
    for e in vec:
        le = None
        name = ""
        rest = []
        for k, v in e.labels:
            if k == "le":
                le = v
            elif k == NAME:
                name = v
            else:
                rest.append((k, v))
        if le is None:
            continue
        ub = _parse_le(le)
        if ub is None:
            continue
        groups.setdefault((tuple(rest), name), []).append((ub, e.value))
    return [Elem(lab, bucket_quantile(q, b)) for (lab, _), b in groups.items()]
