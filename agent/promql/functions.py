"""The PromQL functions kcops evaluates, by name (Prometheus 2.42 semantics).

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

from kcops.agent.promql import rangefns
from kcops.agent.promql.aggregations import LABEL_NAME, reverse, value_less
from kcops.agent.promql.gosort import go_sort
from kcops.agent.promql.histogram import histogram_quantile
from kcops.agent.promql.mathfns import CALENDAR, TRIG, go_int64
from kcops.agent.promql.model import (
    NAME,
    Elem,
    EvalError,
    Labels,
    Value,
    Vector,
    drop_name,
    labels_of,
)
from kcops.agent.promql.regex import compile_anchored, expand
from kcops.agent.promql.selectors import CompiledSelector

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


def _string(ev: Ev, node: pp.Expr, t: float) -> str:
    v = ev.eval(node, t)
    if not isinstance(v, str):
        raise EvalError(f"expected a string argument, got {type(v).__name__}")
    return v


def _with_label(labels: Labels, name: str, value: str) -> Labels:
    d = dict(labels)
    d[name] = value  # an empty value removes the label, as labels.Builder does
    return labels_of(d)


def _label_replace(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    vec = ev.eval_vector(args[0], t)
    dst, repl, src, regex = (_string(ev, a, t) for a in args[1:5])
    rx = compile_anchored(regex)
    if not LABEL_NAME.match(dst):
        raise EvalError(f"invalid destination label name in label_replace(): {dst}")
    out: Vector = []
    for e in vec:
        m = rx.search(dict(e.labels).get(src, ""))
        if m is None:
            out.append(e)
            continue
        out.append(Elem(_with_label(e.labels, dst, expand(rx, repl, m)), e.value))
    return out


def _label_join(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    vec = ev.eval_vector(args[0], t)
    dst, sep = _string(ev, args[1], t), _string(ev, args[2], t)
    srcs = [_string(ev, a, t) for a in args[3:]]
    for src in srcs:
        if not LABEL_NAME.match(src):
            raise EvalError(f"invalid source label name in label_join(): {src}")
    if not LABEL_NAME.match(dst):
        raise EvalError(f"invalid destination label name in label_join(): {dst}")
    out: Vector = []
    for e in vec:
        d = dict(e.labels)
        joined = sep.join(d.get(s, "") for s in srcs)
        out.append(Elem(_with_label(e.labels, dst, joined), e.value))
    return out


def _sort(descending: bool) -> Fn:
    # Prometheus 2.42: sort() is sort.Sort(sort.Reverse(vectorByReverseValueHeap)),
    # sort_desc() the same over vectorByValueHeap, so NaN goes last in both.
    less = reverse(value_less(not descending))

    def fn(ev: Ev, args: list[pp.Expr], t: float) -> Value:
        # sort() keeps the metric name: it only reorders.
        vec = list(ev.eval_vector(args[0], t))
        go_sort(vec, less)
        return vec

    return fn


def _timestamp(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    # A plain selector gives each sample's own time; any other expression's
    # samples carry the evaluation time (Prometheus special-cases the same).
    stamped = ev.eval_stamped(args[0], t)
    return [Elem(drop_name(e.labels), rangefns._ms(ts) / 1000) for e, ts in stamped]


def _calendar(f: Callable[[int], float]) -> Fn:
    def fn(ev: Ev, args: list[pp.Expr], t: float) -> Value:
        if not args:
            return [Elem((), f(int(rangefns._ms(t) / 1000)))]
        return [Elem(drop_name(e.labels), f(go_int64(e.value))) for e in ev.eval_vector(args[0], t)]

    return fn


def _pi(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    return math.pi


def _linear(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    """``deriv(v[r])``, or ``predict_linear(v[r], ahead_s)`` when a second argument is given."""
    series, _, _, _ = ev.eval_range(args[0], t)
    ahead_s = ev.eval_scalar(args[1], t) if len(args) > 1 else None
    out: Vector = []
    for labels, ts, vs in series:
        v = (
            rangefns.deriv(ts, vs)
            if ahead_s is None
            else rangefns.predict_linear(ts, vs, t, ahead_s)
        )
        if v is not None:
            out.append(Elem(drop_name(labels), v))
    return out


def _present_over_time(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    series, _, _, _ = ev.eval_range(args[0], t)
    return [Elem(drop_name(labels), 1.0) for labels, _, _ in series]


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
    "label_replace": _label_replace,
    "label_join": _label_join,
    "sort": _sort(False),
    "sort_desc": _sort(True),
    "timestamp": _timestamp,
    "pi": _pi,
    "deriv": _linear,
    "predict_linear": _linear,
    "present_over_time": _present_over_time,
    **{name: _calendar(f) for name, f in CALENDAR.items()},
    **{name: _simple(op) for name, op in TRIG.items()},
}


__all__ = ["FUNCTIONS", "NAME"]
