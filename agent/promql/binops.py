"""Binary operators: arithmetic, comparison (filter and bool), and/or/unless, vector matching.

Follows Prometheus 2.x engine.go: arithmetic drops the metric name, a
comparison without ``bool`` keeps the left sample as it is, one-to-one
matching with ``on`` keeps only the matching labels, ``group_left/right``
copy the listed labels from the "one" side.
"""

from __future__ import annotations

import math

import promql_parser as pp

from kcops.agent.promql.model import NAME, Elem, EvalError, Labels, Vector, drop_name, get_label

COMPARISON = frozenset({"==", "!=", ">", "<", ">=", "<="})
SET_OPS = frozenset({"and", "or", "unless"})
# engine.go's shouldDropMetricName: the arithmetic operators, not atan2 (which keeps it).
DROPS_NAME = frozenset({"+", "-", "*", "/", "%", "^"})


def arith(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            if a == 0 or math.isnan(a):
                return math.nan
            return math.copysign(math.inf, a) * math.copysign(1.0, b)
        return a / b
    if op == "%":
        try:
            return math.fmod(a, b)
        except ValueError:
            return math.nan
    if op == "^":
        try:
            return math.pow(a, b)
        except OverflowError:
            return math.inf if a > 0 or (float(b).is_integer() and b % 2 == 0) else -math.inf
        except ValueError:
            if a == 0:
                return math.inf
            return math.nan
    if op == "atan2":
        return math.atan2(a, b)
    raise AssertionError(op)


def compare(op: str, a: float, b: float) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op == ">":
        return a > b
    if op == "<":
        return a < b
    if op == ">=":
        return a >= b
    if op == "<=":
        return a <= b
    raise AssertionError(op)


def elem_op(op: str, a: float, b: float) -> tuple[float, bool]:
    """(value, keep) as Prometheus's vectorElemBinop."""
    if op in COMPARISON:
        return a, compare(op, a, b)
    return arith(op, a, b), True


def scalar_op(op: str, a: float, b: float, return_bool: bool) -> float:
    if op in COMPARISON:
        return 1.0 if compare(op, a, b) else 0.0
    return arith(op, a, b)


def vector_scalar(
    op: str, vec: Vector, scalar: float, scalar_on_left: bool, return_bool: bool
) -> Vector:
    out: Vector = []
    drop = op in DROPS_NAME or return_bool
    for e in vec:
        lv, rv = (scalar, e.value) if scalar_on_left else (e.value, scalar)
        value, keep = elem_op(op, lv, rv)
        if op in COMPARISON and scalar_on_left:
            value = rv
        if return_bool:
            value = 1.0 if keep else 0.0
            keep = True
        if keep:
            out.append(Elem(drop_name(e.labels) if drop else e.labels, value))
    return out


class Matching:
    """The parsed ``on/ignoring`` and ``group_left/right`` of one binary expression."""

    def __init__(self, modifier: pp.BinModifier | None, op: str) -> None:
        self.on = False
        self.labels: frozenset[str] = frozenset()
        self.card = "many-to-many" if op in SET_OPS else "one-to-one"
        self.include: list[str] = []
        self.return_bool = False
        if modifier is None:
            return
        self.return_bool = bool(modifier.return_bool)
        if modifier.matching is not None:
            self.on = modifier.matching.type == pp.LabelModifierType.Include
            self.labels = frozenset(modifier.matching.labels)
        card = modifier.card
        if op not in SET_OPS:
            if card == pp.VectorMatchCardinality.ManyToOne:
                self.card = "many-to-one"
            elif card == pp.VectorMatchCardinality.OneToMany:
                self.card = "one-to-many"
        self.include = list(modifier.group_labels or [])

    def signature(self, labels: Labels) -> Labels:
        if self.on:
            return tuple((k, get_label(labels, k)) for k in sorted(self.labels))
        return tuple(p for p in labels if p[0] not in self.labels and p[0] != NAME)


def set_op(op: str, m: Matching, lhs: Vector, rhs: Vector) -> Vector:
    if op == "and":
        if not lhs or not rhs:
            return []
        sigs = {m.signature(e.labels) for e in rhs}
        return [e for e in lhs if m.signature(e.labels) in sigs]
    if op == "unless":
        if not rhs:
            return list(lhs)
        sigs = {m.signature(e.labels) for e in rhs}
        return [e for e in lhs if m.signature(e.labels) not in sigs]
    left_sigs = {m.signature(e.labels) for e in lhs}
    return list(lhs) + [e for e in rhs if m.signature(e.labels) not in left_sigs]


def _result_labels(op: str, m: Matching, lhs: Labels, rhs: Labels) -> Labels:
    d = dict(lhs)
    if op in DROPS_NAME:
        d.pop(NAME, None)
    if m.card == "one-to-one":
        if m.on:
            d = {k: v for k, v in d.items() if k in m.labels}
        else:
            for k in m.labels:
                d.pop(k, None)
    for name in m.include:
        v = get_label(rhs, name)
        if v:
            d[name] = v
        else:
            d.pop(name, None)
    return tuple(sorted(d.items()))


def vector_vector(op: str, m: Matching, lhs: Vector, rhs: Vector) -> Vector:
    if op in SET_OPS:
        return set_op(op, m, lhs, rhs)
    if not lhs or not rhs:
        return []
    if m.card == "one-to-many":
        lhs, rhs = rhs, lhs
    right: dict[Labels, Elem] = {}
    for e in rhs:
        sig = m.signature(e.labels)
        if sig in right:
            side = "left" if m.card == "one-to-many" else "right"
            raise EvalError(
                f"found duplicate series for the match group {dict(sig)} on the {side} hand-side "
                "of the operation; many-to-many matching not allowed"
            )
        right[sig] = e
    matched: dict[Labels, set[Labels] | None] = {}
    out: Vector = []
    for e in lhs:
        sig = m.signature(e.labels)
        r = right.get(sig)
        if r is None:
            continue
        vl, vr = e.value, r.value
        if m.card == "one-to-many":
            vl, vr = vr, vl
        value, keep = elem_op(op, vl, vr)
        if m.return_bool:
            value = 1.0 if keep else 0.0
        elif not keep:
            continue
        metric = _result_labels(op, m, e.labels, r.labels)
        if m.return_bool:
            metric = drop_name(metric)
        if m.card == "one-to-one":
            if sig in matched:
                raise EvalError(
                    "multiple matches for labels: many-to-one matching must be explicit "
                    "(group_left/group_right)"
                )
            matched[sig] = None
        else:
            inserted = matched.get(sig)
            if inserted is None:
                inserted = set()
                matched[sig] = inserted
            elif metric in inserted:
                raise EvalError(
                    "multiple matches for labels: grouping labels must ensure unique matches"
                )
            inserted.add(metric)
        out.append(Elem(metric, value))
    return out
