"""The budget that holds mass p for a share q of attention calls, read from K(C) buckets.

Stdlib only (callers pass the bucket bounds: the wire format's, ``BUCKETS[KC_TOKENS]``
of :mod:`kcops.kernels.wire`, so this module imports no kernel and the agent may use
it): the agent's live recommendation
(``kcops.agent.kcrec``) and ``kc sweep``'s calibration (``kcops.lab.sweepcal``)
compute it with the same function, so the sweep's coverage and the live figure are the
same measure.

A layer's budget at quantile q is the q-quantile of its K_p observations (K_p: the keys
that hold mass p, union over a KV group's heads), estimated as Prometheus's
``histogram_quantile`` does (linear within the bucket the rank falls in). The buckets
bound it: the order statistic of rank ceil(q * n) lies above the bucket's lower bound
and at or below its upper bound, so ``(low, high]`` is a sure interval (no sampling
error is in it: it says what the buckets cannot tell apart, not how far another hour
of traffic would move the figure).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Quantile:
    """The q-quantile of one histogram: ``tokens`` (the interpolated estimate), within
    ``(low, high]`` (``high`` is inf in the +Inf bucket); ``samples`` observations."""

    tokens: float
    low: float
    high: float
    samples: int

    @property
    def budget(self) -> int:
        """The estimate as a whole number of tokens (rounded up: a budget holds whole keys)."""
        return max(1, math.ceil(self.tokens - 1e-9))


def bucket_counts(values: Iterable[float], bounds: Sequence[float]) -> list[int]:
    """Non-cumulative counts of ``values`` in ``bounds`` (+Inf last), as the probe fills them."""
    counts = [0] * (len(bounds) + 1)
    for v in values:
        counts[bisect_left(bounds, v)] += 1
    return counts


def quantile(q: float, counts: Sequence[float], bounds: Sequence[float]) -> Quantile | None:
    """The q-quantile (0 < q <= 1) of non-cumulative bucket ``counts``; None when empty."""
    if not 0.0 < q <= 1.0:
        raise ValueError(f"quantile {q!r}: allowed (0, 1]")
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} bucket counts for {len(bounds)} bounds (+Inf)")
    n = sum(counts)
    if n <= 0:
        return None
    rank = q * n
    acc = prev = 0.0
    i = 0
    while i < len(counts):
        prev, acc = acc, acc + counts[i]
        if acc >= rank - 1e-9 * n and counts[i] > 0:
            break
        i += 1
    i = min(i, len(counts) - 1)
    c = counts[i]
    low = bounds[i - 1] if i > 0 else 0.0
    if i == len(bounds):  # the +Inf bucket: Prometheus answers the last finite bound
        return Quantile(float(bounds[-1]), float(bounds[-1]), math.inf, round(n))
    high = float(bounds[i])
    est = low + (high - low) * min(1.0, max(0.0, (rank - prev) / c))
    return Quantile(est, float(low), high, round(n))


def uniform(per_layer: Mapping[str, Quantile]) -> Quantile | None:
    """The one N that covers every layer's quantile: the largest estimate, within the
    largest lower and the largest upper bound (max is monotone, so the bounds hold)."""
    if not per_layer:
        return None
    qs = list(per_layer.values())
    return Quantile(
        max(x.tokens for x in qs),
        max(x.low for x in qs),
        max(x.high for x in qs),
        min(x.samples for x in qs),
    )


def uniform_at(q: float, hists: Mapping[str, Sequence[float]], bounds: Sequence[float]) -> float:
    """The uniform estimate at quantile ``q`` over non-empty ``hists`` (0 when none)."""
    got = [quantile(q, c, bounds) for c in hists.values()]
    return max((x.tokens for x in got if x is not None), default=0.0)


def matching_quantile(
    n: float, hists: Mapping[str, Sequence[float]], bounds: Sequence[float]
) -> tuple[float, str]:
    """The call quantile q at which :func:`uniform_at` equals ``n``, and how it matched:
    ``exact``; ``above_all`` (``n`` is above every call's K_p: q = 1); ``below_all``
    (``n`` is below the smallest estimate: q is the smallest searched, 0.001).

    The uniform estimate is continuous and non-decreasing in q (linear pieces within
    buckets), so bisection finds it; ties resolve to the smallest such q."""
    lo, hi = 0.001, 1.0
    if uniform_at(hi, hists, bounds) < n:
        return 1.0, "above_all"
    if uniform_at(lo, hists, bounds) >= n:
        return lo, "below_all"
    for _ in range(50):
        mid = (lo + hi) / 2
        if uniform_at(mid, hists, bounds) >= n:
            hi = mid
        else:
            lo = mid
    return round(hi, 4), "exact"
