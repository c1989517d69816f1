"""Histogram buckets over a window, read from the agent's store.

What a window holds is each bucket series' increase from the window's start to its end,
summed over the series that share the grouping label (``engine`` and ``process`` are
summed away). Unlike PromQL's ``increase()`` nothing is extrapolated: these are counts of
observations, the evidence the recommendation shows. A counter reset (the agent's probe
sums of a process forgotten and started again) adds the new value, as Prometheus does; a
series born inside the window counts from zero, which needs the store to keep samples
from before the window (the recommender keeps its window within the store's retention).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable

from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store


def increase(store: Store, key: SeriesKey, start: float, end: float) -> float:
    """Observations added to the cumulative series ``key`` in ``(start, end]``."""
    base = store.latest(key, at=start)
    prev = base[1] if base is not None else 0.0
    _ts, vs = store.range_arrays(key, start, end, left_open=True)
    if not vs:
        return 0.0
    if (
        not any(map(math.isnan, vs))
        and vs[0] >= prev
        and not any(map(operator.lt, vs[1:], vs[:-1]))
    ):
        return vs[-1] - prev
    total = 0.0
    for v in vs:  # resets or staleness markers: the slow walk
        if math.isnan(v):
            continue
        total += v - prev if v >= prev else v
        prev = v
    return total


def _parse_le(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return math.inf if text.strip().lower() in ("+inf", "inf") else None


def window_buckets(
    store: Store, name: str, by: str | None, start: float, end: float
) -> dict[str, tuple[tuple[float, ...], list[float]]]:
    """Per value of label ``by`` (``""`` for all when None): the finite bucket bounds and the
    non-cumulative counts (+Inf last) of histogram ``name`` over ``(start, end]``."""
    cum: dict[str, dict[float, float]] = {}
    for key in store.keys(name + "_bucket"):
        labels = dict(key.labels)
        ub = _parse_le(labels.get("le", ""))
        if ub is None:
            continue
        group = labels.get(by, "") if by else ""
        got = increase(store, key, start, end)
        per = cum.setdefault(group, {})
        per[ub] = per.get(ub, 0.0) + got
    return {group: b for group, per in cum.items() if (b := buckets(per)) is not None}


def buckets(cumulative: dict[float, float]) -> tuple[tuple[float, ...], list[float]] | None:
    """A histogram's cumulative counts by upper bound as (finite bounds, non-cumulative
    counts, +Inf last), or None without the +Inf bucket. Shared by the agent's window
    and the CLI's fleet window (kcops.cli.kc_fleet)."""
    if math.inf not in cumulative:
        return None
    bounds = sorted(cumulative)
    counts: list[float] = []
    top = 0.0
    for ub in bounds:
        c = max(cumulative[ub], top)  # cumulative counts never fall
        counts.append(c - top)
        top = c
    return tuple(bounds[:-1]), counts


def parse_le(text: str) -> float | None:
    """A bucket's ``le`` label as a float (``+Inf`` is inf), or None when it is none."""
    return _parse_le(text)


def latest_sum(store: Store, name: str, at: float, lookback_s: float) -> float | None:
    """The sum of the newest values of every series of ``name`` (None when none has one)."""
    got = [store.latest(k, at=at, lookback_s=lookback_s) for k in store.keys(name)]
    vals = [v for _, v in (g for g in got if g is not None) if math.isfinite(v)]
    return sum(vals) if vals else None


def latest_max(store: Store, name: str, at: float, lookback_s: float) -> float | None:
    got = [store.latest(k, at=at, lookback_s=lookback_s) for k in store.keys(name)]
    vals = [v for _, v in (g for g in got if g is not None) if math.isfinite(v)]
    return max(vals) if vals else None


def latest_each(store: Store, name: str, at: float, lookback_s: float) -> dict[str, float]:
    """The newest finite value of each series of ``name``, by ``engine/process``."""
    out = {}
    for k in store.keys(name):
        got = store.latest(k, at=at, lookback_s=lookback_s)
        if got is not None and math.isfinite(got[1]):
            d = dict(k.labels)
            out[f"{d.get('engine', '?')}/{d.get('process', '?')}"] = got[1]
    return out


def int_layers(layers: Iterable[str]) -> dict[str, int]:
    """The layer labels that are layer indices."""
    return {lay: int(lay) for lay in layers if lay.isdigit()}


def layer_counts(
    store: Store, name: str, start: float, end: float
) -> dict[str, tuple[float, float]]:
    """Per ``layer``: what counter ``name`` added over ``(start, end]`` (summed over
    processes) and the seconds of that window its series cover (from their first sample)."""
    out: dict[str, tuple[float, float]] = {}
    for key in store.keys(name):
        layer = dict(key.labels).get("layer", "")
        ts, _ = store.range_arrays(key, start, end)
        first = start if store.latest(key, at=start) is not None else (ts[0] if ts else end)
        n, since = out.get(layer, (0.0, end))
        out[layer] = (n + increase(store, key, start, end), min(since, first))
    return {layer: (n, end - since) for layer, (n, since) in out.items()}
