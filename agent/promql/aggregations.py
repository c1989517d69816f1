"""Aggregation operators (sum, avg, min, max, count, quantile, topk, ...) with by/without."""

from __future__ import annotations

import math
import re
from decimal import Decimal

import promql_parser as pp

from kcops.agent.promql.gosort import Less, go_sort, heap_pop, heap_push
from kcops.agent.promql.model import NAME, Elem, EvalError, Labels, Vector, labels_of
from kcops.agent.promql.rangefns import mean_stays_inf, quantile

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def value_less(descending: bool) -> Less:
    """Prometheus 2.42's ``vectorByValueHeap.Less`` (``vectorByReverseValueHeap`` when descending).

    NaN is less than everything, NaN included: not an order, but the one Go's
    algorithms run with (gosort.py).
    """
    if descending:
        return lambda a, b: math.isnan(a.value) or a.value > b.value
    return lambda a, b: math.isnan(a.value) or a.value < b.value


def reverse(less: Less) -> Less:
    """``sort.Reverse``."""
    return lambda a, b: less(b, a)


def group_key(labels: Labels, names: frozenset[str], without: bool) -> Labels:
    if without:
        return tuple(p for p in labels if p[0] not in names and p[0] != NAME)
    return tuple(p for p in labels if p[0] in names)


def aggregate(
    op: str, modifier: pp.AggModifier | None, param: float | str | None, vec: Vector
) -> Vector:
    """One aggregation; groups come out in first-seen order, as Prometheus 2.42's do.

    ``topk``/``bottomk`` order each group's elements (descending / ascending,
    NaN last) with Prometheus's own procedure (:func:`_topk`).
    """
    without = modifier is not None and modifier.type == pp.AggModifierType.Without
    names = frozenset(modifier.labels) if modifier is not None else frozenset()
    if op == "count_values":
        assert isinstance(param, str)
        return _count_values(param, names, without, vec)
    assert not isinstance(param, str)
    groups: dict[Labels, list[Elem]] = {}
    for e in vec:
        groups.setdefault(group_key(e.labels, names, without), []).append(e)
    if op in ("topk", "bottomk"):
        return _topk(op == "topk", param, groups)
    out: Vector = []
    for key, elems in groups.items():
        values = [e.value for e in elems]
        out.append(Elem(key, _reduce(op, param, values)))
    return out


def _reduce(op: str, param: float | None, values: list[float]) -> float:
    if op == "sum":
        total = 0.0
        for v in values:
            total += v
        return total
    if op == "count":
        return float(len(values))
    if op == "group":
        return 1.0
    if op == "max":
        out = values[0]
        for v in values[1:]:
            if out < v or math.isnan(out):
                out = v
        return out
    if op == "min":
        out = values[0]
        for v in values[1:]:
            if out > v or math.isnan(out):
                out = v
        return out
    if op == "avg":
        mean = values[0]
        count = 1.0
        for v in values[1:]:
            count += 1
            if mean_stays_inf(mean, v):
                continue
            mean += v / count - mean / count
        return mean
    if op in ("stddev", "stdvar"):
        count = 1.0
        mean = values[0]
        acc = 0.0
        for v in values[1:]:
            count += 1
            delta = v - mean
            mean += delta / count
            acc += delta * (v - mean)
        var = acc / count
        return math.sqrt(var) if op == "stddev" else var
    if op == "quantile":
        assert param is not None
        return quantile(param, values)
    raise AssertionError(op)


def go_format_f(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``: shortest digits, never an exponent."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    text = format(Decimal(repr(v)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _count_values(label: str, names: frozenset[str], without: bool, vec: Vector) -> Vector:
    if not LABEL_NAME.match(label):
        raise EvalError(f"invalid label name {label!r}")
    if not without:
        names = names | {label}
    counts: dict[Labels, float] = {}
    for e in vec:
        d = dict(e.labels)
        d[label] = go_format_f(e.value)
        key = group_key(labels_of(d), names, without)
        counts[key] = counts.get(key, 0.0) + 1.0
    return [Elem(k, n) for k, n in counts.items()]


def _topk(top: bool, param: float | None, groups: dict[Labels, list[Elem]]) -> Vector:
    """Prometheus 2.42's selection: a heap of k per group, then ``sort.Sort(sort.Reverse(heap))``.

    Among equal values (and NaNs) the series kept and their order are those
    of Go's algorithms over the input order, which is label order here as in
    a compacted Prometheus block.
    """
    assert param is not None
    if math.isinf(param):
        raise EvalError(f"scalar value {param} overflows int64 (topk/bottomk parameter)")
    k = int(param) if not math.isnan(param) else 0
    if k < 1:
        return []
    less = value_less(not top)  # topk keeps the least of its k at the root
    out: Vector = []
    for elems in groups.values():
        heap: list[Elem] = []
        for e in elems:
            if len(heap) < k:
                heap_push(heap, e, less)
                continue
            w = heap[0].value
            if (w < e.value if top else w > e.value) or math.isnan(w):
                if k == 1:
                    heap[0] = e  # in place for k == 1, as Prometheus does
                    continue
                heap_pop(heap, less)
                heap_push(heap, e, less)
        go_sort(heap, reverse(less))
        out.extend(heap)
    return out
