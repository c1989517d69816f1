"""More PromQL functions (Prometheus 2.42 semantics), registered into ``FUNCTIONS``.

Label functions (``label_replace``, ``label_join``), ordering (``sort``,
``sort_desc``), ``timestamp``, calendar and trigonometric functions, ``sgn``,
and the regression family (``deriv``, ``predict_linear``),
``present_over_time``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import promql_parser as pp

from kcops.agent.rules import rangefns
from kcops.agent.rules.aggregations import LABEL_NAME, reverse, value_less
from kcops.agent.rules.gosort import go_sort
from kcops.agent.rules.mathfns import CALENDAR, TRIG, go_int64
from kcops.agent.rules.model import Elem, EvalError, Labels, Value, Vector, drop_name, labels_of
from kcops.agent.rules.regex import compile_anchored, expand

if TYPE_CHECKING:
    from kcops.agent.rules.functions import Ev, Fn


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


def _elementwise(op: Callable[[float], float]) -> Fn:
    def fn(ev: Ev, args: list[pp.Expr], t: float) -> Value:
        return [Elem(drop_name(e.labels), op(e.value)) for e in ev.eval_vector(args[0], t)]

    return fn


def _pi(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    return math.pi


def _deriv(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    series, _, _, _ = ev.eval_range(args[0], t)
    out: Vector = []
    for labels, ts, vs in series:
        v = rangefns.deriv(ts, vs)
        if v is not None:
            out.append(Elem(drop_name(labels), v))
    return out


def _predict_linear(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    series, _, _, _ = ev.eval_range(args[0], t)
    ahead_s = ev.eval_scalar(args[1], t)
    out: Vector = []
    for labels, ts, vs in series:
        v = rangefns.predict_linear(ts, vs, t, ahead_s)
        if v is not None:
            out.append(Elem(drop_name(labels), v))
    return out


def _present_over_time(ev: Ev, args: list[pp.Expr], t: float) -> Value:
    series, _, _, _ = ev.eval_range(args[0], t)
    return [Elem(drop_name(labels), 1.0) for labels, _, _ in series]


EXTRA: dict[str, Fn] = {
    "label_replace": _label_replace,
    "label_join": _label_join,
    "sort": _sort(False),
    "sort_desc": _sort(True),
    "timestamp": _timestamp,
    "pi": _pi,
    "deriv": _deriv,
    "predict_linear": _predict_linear,
    "present_over_time": _present_over_time,
}
EXTRA.update({name: _calendar(f) for name, f in CALENDAR.items()})
EXTRA.update({name: _elementwise(op) for name, op in TRIG.items()})
