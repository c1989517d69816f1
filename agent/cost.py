"""Cost at full and at effective context, derived from the engine's per-request token series.

The engine exports, per model and tenant, the full context of its finished
requests (``kcops_request_context_tokens``, a histogram) and the effective
context tokens as priced (``kcops_request_priced_effective_tokens_total``: a
sampled request's mean K_p, an unsampled one's full context). A price per 1,000
context tokens (``cost.prices``, by model, ``*`` for any) turns them into two
counters with the same labels:

- ``kcops_cost_full_total`` = price × the histogram's ``_sum`` / 1000;
- ``kcops_cost_effective_total`` = price × the priced effective tokens / 1000.

Both are the engine's counters scaled, computed each scrape with no state of
their own, so they reset when the engine's do and ``increase()`` reads them as
any counter. A model with no price has no cost series (absent, never 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from kcops.agent.samples import Sample

FULL_SOURCE = "kcops_request_context_tokens_sum"
EFFECTIVE_SOURCE = "kcops_request_priced_effective_tokens_total"
TARGETS = {FULL_SOURCE: "kcops_cost_full_total", EFFECTIVE_SOURCE: "kcops_cost_effective_total"}
ANY_MODEL = "*"


def price_of(prices: Mapping[str, float], model: str | None) -> float | None:
    """The price per 1,000 tokens of ``model`` (or of ``*``); None when unpriced."""
    if model is not None and model in prices:
        return prices[model]
    return prices.get(ANY_MODEL)


def cost_samples(samples: Iterable[Sample], prices: Mapping[str, float]) -> list[Sample]:
    """The cost counters of the token series among ``samples``."""
    if not prices:
        return []
    out = []
    for s in samples:
        target = TARGETS.get(s.name)
        if target is None:
            continue
        price = price_of(prices, dict(s.labels).get("model"))
        if price is not None:
            out.append(Sample(target, s.labels, s.value * price / 1000.0, s.ts))
    return out
