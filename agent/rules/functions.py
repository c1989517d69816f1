"""The PromQL functions kcops evaluates, by name.

Each entry takes the evaluator, the call's argument nodes and the evaluation
time (Unix seconds) and returns a value. Functions of a range vector drop the
metric name (except ``last_over_time``), as Prometheus does.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable
from typing import Protocol

import promql_parser as pp

from kcops.agent.rules import rangefns
from kcops.agent.rules.histogram import histogram_quantile
from kcops.agent.rules.model import NAME, Elem, Labels, Value, Vector, drop_name

RangeSeries = list[tuple[Labels, "array[float]", "array[float]"]]


class Ev(Protocol):
    def eval(self, node: pp.Expr, t: float) -> Value: ...

    def eval_vector(self, node: pp.Expr, t: float) -> Vector: ...

    def eval_scalar(self, node: pp.Expr, t: float) -> float: ...

    def eval_range(self, node: pp.Expr, t: float) -> tuple[RangeSeries, float, float, float]: ...

    def eval_stamped(self, node: pp.Expr, t: float) -> list[tuple[Elem, float]]: ...


Fn = Callable[[Ev, list[pp.Expr], float], Value]


def _rate_like(is_counter: bool, is_rate: bool) -> Fn:
    def fn(ev: Ev, args: list[pp.Expr], t: float) -> Value:
        series, start, end, range_s = ev.eval_range(args[0], t)
        out: Vector = []
        for labels, ts, vs in series:
            v = rangefns.extrapolated_rate(ts, vs, start, end, range_s, is_counter, is_rate)
            if v is not None:
                out.append(Elem(drop_name(labels), v))
        return out

    return fn


def _instant_rate(is_rate: bool) -> Fn:
    def fn(ev: Ev, args: list[pp.Expr], t: float) -> Value:
        series, _, _, _ = ev.eval_range(args[0], t)
        out: Vector = []
        for labels, ts, vs in series:
            v = rangefns.instant_rate(ts, vs, is_rate)
            if v is not None:
                out.append(Elem(drop_name(labels), v))
        return out

    return fn


def _over_time(agg: Callable[[array[float]], float], keep_name: bool = False) -> Fn:
    def fn(ev: Ev, args: list[pp.Expr], t: float) -> Value:
        series, _, _, _ = ev.eval_range(args[0], t)
        return [
            Elem(labels if keep_name else drop_name(labels), agg(vs)) for labels, _, vs in series
        ]

    return fn


def _quantile_over_time(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    q = ev.eval_scalar(args[0], t)
    series, _, _, _ = ev.eval_range(args[1], t)
    return [Elem(drop_name(labels), rangefns.quantile(q, list(vs))) for labels, _, vs in series]


def _simple(op: Callable[[float], float]) -> Fn:
    def fn(ev: Ev, args: list[pp.Expr], t: float) -> Value:
        return [Elem(drop_name(e.labels), op(e.value)) for e in ev.eval_vector(args[0], t)]

    return fn


def _safe(op: Callable[[float], float]) -> Callable[[float], float]:
    def wrapped(v: float) -> float:
        try:
            return op(v)
        except (ValueError, OverflowError):
            if math.isnan(v):
                return math.nan
            if op is math.sqrt or v < 0:
                return math.nan
            if v == 0:
                return -math.inf
            return math.inf

    return wrapped


def _ceil(v: float) -> float:
    return v if math.isnan(v) or math.isinf(v) else float(math.ceil(v))


def _floor(v: float) -> float:
    return v if math.isnan(v) or math.isinf(v) else float(math.floor(v))


def _clamp_value(v: float, lo: float, hi: float) -> float:
    if math.isnan(v) or math.isnan(lo) or math.isnan(hi):
        return math.nan
    return max(lo, min(hi, v))


def _clamp(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    vec = ev.eval_vector(args[0], t)
    lo = ev.eval_scalar(args[1], t)
    hi = ev.eval_scalar(args[2], t)
    if hi < lo:
        return []
    return [Elem(drop_name(e.labels), _clamp_value(e.value, lo, hi)) for e in vec]


def _clamp_min(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    vec = ev.eval_vector(args[0], t)
    lo = ev.eval_scalar(args[1], t)
    return [Elem(drop_name(e.labels), _clamp_value(e.value, lo, math.inf)) for e in vec]


def _clamp_max(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    vec = ev.eval_vector(args[0], t)
    hi = ev.eval_scalar(args[1], t)
    return [Elem(drop_name(e.labels), _clamp_value(e.value, -math.inf, hi)) for e in vec]


def _round(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    vec = ev.eval_vector(args[0], t)
    to = ev.eval_scalar(args[1], t) if len(args) > 1 else 1.0
    inv = 1.0 / to if to != 0 else math.inf

    def r(v: float) -> float:
        try:
            return math.floor(v * inv + 0.5) / inv
        except ZeroDivisionError:
            return math.nan  # to_nearest = ±Inf: Go computes floor(v*0 + 0.5) / 0 = NaN
        except (ValueError, OverflowError):
            return v * inv / inv if not math.isnan(v) else v

    return [Elem(drop_name(e.labels), r(e.value)) for e in vec]


def _absent_labels(node: pp.Expr) -> Labels:
    from kcops.agent.rules.selectors import CompiledSelector

    if isinstance(node, pp.MatrixSelector):
        node = node.vector_selector
    if not isinstance(node, pp.VectorSelector):
        return ()
    sel = CompiledSelector(node)
    seen: dict[str, int] = {}
    for m in node.matchers.matchers:
        seen[m.name] = seen.get(m.name, 0) + 1
    return tuple(sorted((k, v) for k, v in sel.equal_labels.items() if seen[k] == 1))


def _absent(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    if ev.eval_vector(args[0], t):
        return []
    return [Elem(_absent_labels(args[0]), 1.0)]


def _absent_over_time(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    series, _, _, _ = ev.eval_range(args[0], t)
    if series:
        return []
    return [Elem(_absent_labels(args[0]), 1.0)]


def _histogram_quantile(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    q = ev.eval_scalar(args[0], t)
    return histogram_quantile(q, ev.eval_vector(args[1], t))


def _scalar(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    vec = ev.eval_vector(args[0], t)
    return vec[0].value if len(vec) == 1 else math.nan


def _vector(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    return [Elem((), ev.eval_scalar(args[0], t))]


def _time(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    return float(t)


FUNCTIONS: dict[str, Fn] = {
    "rate": _rate_like(True, True),
    "increase": _rate_like(True, False),
    "delta": _rate_like(False, False),
    "irate": _instant_rate(True),
    "idelta": _instant_rate(False),
    "avg_over_time": _over_time(rangefns.avg_over_time),
    "min_over_time": _over_time(rangefns.min_over_time),
    "max_over_time": _over_time(rangefns.max_over_time),
    "sum_over_time": _over_time(rangefns.sum_over_time),
    "count_over_time": _over_time(lambda vs: float(len(vs))),
    "last_over_time": _over_time(lambda vs: vs[-1], keep_name=True),
    "stddev_over_time": _over_time(rangefns.stddev_over_time),
    "stdvar_over_time": _over_time(rangefns.stdvar_over_time),
    "quantile_over_time": _quantile_over_time,
    "changes": _over_time(rangefns.changes),
    "resets": _over_time(rangefns.resets),
    "histogram_quantile": _histogram_quantile,
    "abs": _simple(abs),
    "ceil": _simple(_ceil),
    "floor": _simple(_floor),
    "sqrt": _simple(_safe(math.sqrt)),
    "exp": _simple(_safe(math.exp)),
    "ln": _simple(_safe(math.log)),
    "log2": _simple(_safe(math.log2)),
    "log10": _simple(_safe(math.log10)),
    "round": _round,
    "clamp": _clamp,
    "clamp_min": _clamp_min,
    "clamp_max": _clamp_max,
    "absent": _absent,
    "absent_over_time": _absent_over_time,
    "scalar": _scalar,
    "vector": _vector,
    "time": _time,
}


def _register_more() -> None:
    from kcops.agent.rules.vectorfns import EXTRA

    FUNCTIONS.update(EXTRA)


_register_more()

__all__ = ["FUNCTIONS", "NAME"]
