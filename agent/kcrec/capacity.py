"""Capacity at the recommended budget: what the current load's KV would be, computed.

The engine's own figures say what the running sequences hold now
(``kcops_kv_cache_bytes``; on engines without it, ``kcops_kv_cache_usage_ratio``).
A sequence of context C holds, per layer, C keys under full attention and min(C, N)
under a budget N (docs/kc.md: "The budget as the worker serves it"); dense layers keep
C. So, with D dense of L layers, a load holds a share
``(D + (L - D) * E[min(C, N)] / E[C]) / L`` of its full-context KV, the expectations over
the window's context lengths (``kcops_context_tokens``, the probe's sampled calls; each
bucket stands for its midpoint). The current share follows the engine's budget (full
attention on an engine without one, in fallback mode, or for contexts below the
reference worker's ``long_threshold``); the recommended share uses the uniform N.
What the same memory would fit is the running sequences times the ratio of the two.
These are estimates from the mean over sampled calls, not a measurement: the capacity
benchmark (docs/benchmarks.md) measures the concurrency actually served.

An engine that says how many tokens its KV cache holds (vLLM: ``vllm:cache_config_info``'s
blocks times block size) gets the figures in tokens too: held now (its usage ratio times
that size) and at the budget. On an engine with no budget in force (no top-N path: vLLM
keeps every key) the document says ``what_if``: what the same memory would hold if the
engine kept only N keys a layer, not what it serves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _mids(bounds: Sequence[float], counts: Sequence[float]) -> list[tuple[float, float]]:
    out = []
    low = 0.0
    for i, c in enumerate(counts):
        if c <= 0:
            low = bounds[i] if i < len(bounds) else low
            continue
        mid = (low + bounds[i]) / 2 if i < len(bounds) else float(bounds[-1])
        out.append((mid, c))
        low = bounds[i] if i < len(bounds) else low
    return out


def kv_share(
    ctx: Sequence[tuple[float, float]],
    n: int | None,
    layers: int,
    dense: int,
    long_threshold: float = 0.0,
) -> float | None:
    """The share of full-context KV a load of contexts ``ctx`` ((C, weight) pairs) holds
    under budget ``n`` (None: full attention) on ``layers - dense`` of ``layers`` layers;
    only contexts of at least ``long_threshold`` get the budget."""
    total = sum(c * w for c, w in ctx)
    if total <= 0 or layers <= 0:
        return None
    if n is None:
        return 1.0
    kept = sum((min(c, n) if c >= long_threshold else c) * w for c, w in ctx)
    dense = min(dense, layers)
    return (dense + (layers - dense) * kept / total) / layers


# The document's figures in the order it lists them; each None until it is known.
FIGURES = (
    "what_if", "kv_bytes_now", "kv_usage_ratio_now", "kv_cache_tokens", "kv_tokens_now",
    "kv_tokens_at_recommended", "cache_sequences_now", "cache_sequences_at_recommended",
    "running_sequences", "mean_context_tokens", "kv_share_now", "kv_share_at_recommended",
    "kv_ratio_at_recommended", "kv_bytes_at_recommended", "kv_usage_ratio_at_recommended",
    "kv_bytes_per_token_estimate", "sequences_at_same_memory", "more_sequences",
)  # fmt: skip


def capacity(
    *,
    context: tuple[Sequence[float], Sequence[float]] | None,
    layers: int,
    dense_now: int,
    n_now: int | None,
    long_threshold: float,
    n_rec: int | None,
    dense_rec: int,
    kv_bytes: float | None,
    kv_usage: float | None,
    running: float | None,
    kv_tokens: float | None = None,
) -> dict[str, Any]:
    """The ``capacity`` part of the document; figures that cannot be known are None.
    ``kv_tokens``: the tokens the engine's KV cache holds when full."""
    held = kv_usage * kv_tokens if kv_usage is not None and kv_tokens is not None else None
    out: dict[str, Any] = dict.fromkeys(FIGURES)
    out.update(
        what_if=n_now is None,
        kv_bytes_now=kv_bytes,
        kv_usage_ratio_now=kv_usage,
        kv_cache_tokens=kv_tokens,
        kv_tokens_now=None if held is None else round(held),
        running_sequences=running,
    )
    if context is None or n_rec is None:
        return out
    ctx = _mids(*context)
    weight = sum(w for _, w in ctx)
    if weight <= 0:
        return out
    mean_c = sum(c * w for c, w in ctx) / weight
    out["mean_context_tokens"] = round(mean_c, 1)
    now = kv_share(ctx, n_now, layers, dense_now, long_threshold)
    rec = kv_share(ctx, n_rec, layers, dense_rec)
    if now is None or rec is None or rec <= 0:
        return out
    ratio = rec / now
    out.update(
        kv_share_now=round(now, 4),
        kv_share_at_recommended=round(rec, 4),
        kv_ratio_at_recommended=round(ratio, 4),
    )
    if kv_bytes is not None:
        out["kv_bytes_at_recommended"] = round(kv_bytes * ratio)
        if running and mean_c > 0:
            out["kv_bytes_per_token_estimate"] = round(kv_bytes / now / (running * mean_c))
    elif kv_usage is not None:
        out["kv_usage_ratio_at_recommended"] = round(kv_usage * ratio, 4)
    if held is not None:
        out["kv_tokens_at_recommended"] = round(held * ratio)
    if kv_tokens:  # whatever runs now: sequences of the mean context the whole cache holds
        out["cache_sequences_now"] = math.floor(kv_tokens / (mean_c * now) + 1e-9)
        out["cache_sequences_at_recommended"] = math.floor(kv_tokens / (mean_c * rec) + 1e-9)
    if running is not None and running > 0:
        fit = math.floor(running / ratio + 1e-9)
        out["sequences_at_same_memory"] = fit
        out["more_sequences"] = fit - round(running)
    return out
