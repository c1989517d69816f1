"""Cost at full and at effective context, derived from the engine's per-request token series.

The engine exports, per model and tenant, the full context of its finished
requests (``kcops_request_context_tokens``, a histogram), the effective context
of those the probe sampled (``kcops_request_effective_context_tokens``, mean K_p)
and the tokens as priced (``kcops_request_priced_effective_tokens_total``: a
sampled request's effective context, an unsampled one's full context). A price per
1,000 context tokens (``cost.prices``, by model, ``*`` for any) turns them into
two counters with the same labels:

- ``kcops_cost_full_total`` = price × the histogram's ``_sum`` / 1000;
- ``kcops_cost_effective_total`` = price × the priced effective tokens / 1000: the
  conservative figure, an unsampled request at its full context.

Both are the engine's counters scaled, computed each scrape with no state of
their own, so they reset when the engine's do and ``increase()`` reads them as
any counter. A model with no price has no cost series (absent, never 0).
``kcops_request_measured_ratio`` (priced or not) is the share of finished requests
the probe sampled.

:func:`estimate` prices the unsampled requests of a window instead at the sampled
ones' effective/full ratio, with an interval (docs/kc.md "Effective context and
cost": why this ratio, what it assumes); ``kcops cost`` applies it to the increases.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from kcops.agent.samples import LabelPairs, Sample

FULL_SOURCE = "kcops_request_context_tokens_sum"
EFFECTIVE_SOURCE = "kcops_request_priced_effective_tokens_total"
TARGETS = {FULL_SOURCE: "kcops_cost_full_total", EFFECTIVE_SOURCE: "kcops_cost_effective_total"}
ANY_MODEL = "*"
REQUESTS = "kcops_request_context_tokens_count"
SAMPLED = "kcops_request_effective_context_tokens_count"
MEASURED = "kcops_request_measured_ratio"
Z95 = 1.96  # a two-sided 95% normal interval
# Sampled requests a (model, tenant) needs to be priced at its own ratio; with fewer it
# borrows its model's (all tenants), then every model's.
MIN_SAMPLED = 5


def price_of(prices: Mapping[str, float], model: str | None) -> float | None:
    """The price per 1,000 tokens of ``model`` (or of ``*``); None when unpriced."""
    if model is not None and model in prices:
        return prices[model]
    return prices.get(ANY_MODEL)


def cost_samples(samples: Iterable[Sample], prices: Mapping[str, float]) -> list[Sample]:
    """The cost counters of the token series among ``samples`` (with a price) and the
    measured share of each series of requests (absent before its first request)."""
    out = []
    counts: dict[LabelPairs, tuple[float, float, float | None]] = {}
    for s in samples:
        if s.name == REQUESTS or s.name == SAMPLED:
            n, k, _ = counts.get(s.labels, (0.0, 0.0, None))
            counts[s.labels] = (s.value, k, s.ts) if s.name == REQUESTS else (n, s.value, s.ts)
            continue
        target = TARGETS.get(s.name)
        if target is None or not prices:
            continue
        price = price_of(prices, dict(s.labels).get("model"))
        if price is not None:
            out.append(Sample(target, s.labels, s.value * price / 1000.0, s.ts))
    for labels, (n, k, ts) in counts.items():
        if n > 0:
            out.append(Sample(MEASURED, labels, min(1.0, k / n), ts))
    return out


# -- the effective context of the requests the probe did not sample -------------------


@dataclass(frozen=True)
class Traffic:
    """One (model, tenant)'s finished requests over a window: its series' increases.
    ``full_sq`` and ``effective_sq`` are sums of squares read off the histograms' buckets
    (:func:`sum_sq`)."""

    requests: float = 0.0
    full: float = 0.0
    full_sq: float = 0.0
    sampled: float = 0.0
    effective: float = 0.0  # of the sampled requests
    effective_sq: float = 0.0
    priced: float = 0.0  # the conservative figure: sampled at effective, others at full

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def unsampled_full(self) -> float:
        return min(self.full, max(0.0, self.priced - self.effective))

    @property
    def sampled_full(self) -> float:
        return self.full - self.unsampled_full


@dataclass(frozen=True)
class Estimate:
    """Effective context tokens of every request of a window (measured for the sampled
    ones, estimated for the others), with a 95% interval; ``ratio_of`` says whose sampled
    requests gave the ratio: ``tenant``, ``model``, ``all`` or ``none`` (then the
    conservative figure)."""

    tokens: float
    low: float
    high: float
    ratio_of: str


def sum_sq(cumulative: Mapping[float, float]) -> float:
    """Σx² of a histogram's observations from its cumulative bucket counts by upper bound
    (``+Inf`` included): each observation taken as uniform over its bucket, ``(lo, hi]``
    (one past the last finite bound at that bound)."""
    total, lo, below = 0.0, 0.0, 0.0
    for hi in sorted(cumulative):
        n = max(0.0, cumulative[hi] - below)
        below = max(below, cumulative[hi])
        if math.isinf(hi):
            total += n * lo * lo
        else:
            total += n * (lo * lo + lo * hi + hi * hi) / 3.0
            lo = hi
    return total


def estimate(traffic: Mapping[tuple[str, str], Traffic]) -> dict[tuple[str, str], Estimate]:
    """The estimate of each (model, tenant): its sampled effective tokens plus its unsampled
    requests' full context times the ratio, sampled effective over sampled full tokens, of
    its own sampled requests, or of its model's, or of everyone's when it has fewer than
    :data:`MIN_SAMPLED` (everyone's needs one)."""
    models: dict[str, Traffic] = {}
    for (model, _), w in traffic.items():
        models[model] = models.get(model, Traffic()) + w
    everyone = sum(traffic.values(), Traffic())
    out = {}
    for key, w in traffic.items():
        pools = (("tenant", w, MIN_SAMPLED), ("model", models[key[0]], MIN_SAMPLED))
        of, pool = next(((o, p) for o, p, least in pools if p.sampled >= least), ("all", everyone))
        out[key] = _priced(w, pool, of)
    return out


def _priced(w: Traffic, pool: Traffic, of: str) -> Estimate:
    unsampled = w.unsampled_full
    if pool.sampled < 1 or pool.sampled_full <= 0:
        return Estimate(w.priced, w.effective, w.priced, "none")
    r = min(1.0, pool.effective / pool.sampled_full)
    tokens = w.effective + r * unsampled
    se = ratio_se(pool, r)
    if se is None:  # spread unknown: between nothing and full context
        return Estimate(tokens, w.effective, w.priced, of)
    half = Z95 * se * unsampled
    # The probe samples by attention call, so its sampled requests may be longer than the
    # rest, whose ratio is then higher when effective context grows slower than full
    # context; pricing each unsampled request at the sampled ones' mean effective context
    # errs the other way. The interval reaches both.
    lo = hi = tokens
    if of == "tenant" and w.sampled < w.requests:
        by_request = w.effective * w.requests / w.sampled
        lo, hi = min(tokens, by_request), max(tokens, by_request)
    return Estimate(tokens, max(w.effective, lo - half), min(w.priced, hi + half), of)


def ratio_se(w: Traffic, r: float) -> float | None:
    """The standard error of the ratio ``r`` of ``w``'s sampled requests, by request (with
    the finite-population correction: its requests are all there is to estimate); None
    below two sampled requests, or without the sums of squares (no buckets: spread unknown).

    A request's residual e − r·f has a spread of at most s_e + r·s_f, whatever the
    correlation of e and f: the series give each one's spread, not their pairs, so this
    bound is used, and the interval is no narrower than it should be. s_f is every
    request's (the series do not split the full context by sampled or not)."""
    n, big_n = w.sampled, w.requests
    if n < 2 or big_n < 2 or w.sampled_full <= 0 or w.effective_sq <= 0 or w.full_sq <= 0:
        return None
    s_e = math.sqrt(max(0.0, (w.effective_sq - w.effective**2 / n) / (n - 1)))
    s_f = math.sqrt(max(0.0, (w.full_sq - w.full**2 / big_n) / (big_n - 1)))
    mean_f = w.sampled_full / n
    return (s_e + r * s_f) / (mean_f * math.sqrt(n)) * math.sqrt(max(0.0, 1.0 - n / big_n))
