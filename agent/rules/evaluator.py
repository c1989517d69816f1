"""Evaluates a parsed (and subset-checked) PromQL expression at one instant over the store."""

from __future__ import annotations

from typing import Any

import promql_parser as pp

from kcops.agent.rules import binops
from kcops.agent.rules.aggregations import aggregate
from kcops.agent.rules.functions import FUNCTIONS, RangeSeries
from kcops.agent.rules.model import EvalError, Value, Vector, check_unique, drop_name
from kcops.agent.rules.selectors import LOOKBACK_S, CompiledSelector, SeriesSource
from kcops.agent.store import Store


class Evaluator:
    """``Evaluator(store).eval(node, t)`` -> float (scalar), str or a vector.

    Selectors are compiled on first use and cached by node identity, so keep
    the parsed nodes alive (the rule objects do).
    """

    def __init__(self, store: Store, lookback_s: float = LOOKBACK_S) -> None:
        self.source = SeriesSource(store, lookback_s)
        self._selectors: dict[int, tuple[Any, CompiledSelector]] = {}

    def _selector(self, vs: Any) -> CompiledSelector:
        got = self._selectors.get(id(vs))
        if got is None or got[0] is not vs:
            got = (vs, CompiledSelector(vs))
            self._selectors[id(vs)] = got
        return got[1]

    # -- typed helpers used by functions ------------------------------------

    def eval_vector(self, node: Any, t: float) -> Vector:
        v = self.eval(node, t)
        if not isinstance(v, list):
            raise EvalError(f"expected an instant vector, got {type(v).__name__}")
        return v

    def eval_scalar(self, node: Any, t: float) -> float:
        v = self.eval(node, t)
        if not isinstance(v, float):
            raise EvalError(f"expected a scalar, got {type(v).__name__}")
        return v

    def eval_range(self, node: Any, t: float) -> tuple[RangeSeries, float, float, float]:
        while isinstance(node, pp.ParenExpr):
            node = node.expr
        if not isinstance(node, pp.MatrixSelector):
            raise EvalError("expected a range vector selector")
        sel = self._selector(node.vector_selector)
        range_s = node.range.total_seconds()
        end = t - sel.offset_s
        return self.source.range(sel, t, range_s), end - range_s, end, range_s

    # -- the tree walk ---------------------------------------------------------

    def eval(self, node: Any, t: float) -> Value:
        if isinstance(node, pp.NumberLiteral):
            return float(node.val)
        if isinstance(node, pp.StringLiteral):
            return str(node.val)
        if isinstance(node, pp.ParenExpr):
            return self.eval(node.expr, t)
        if isinstance(node, pp.VectorSelector):
            return self.source.instant(self._selector(node), t)
        if isinstance(node, pp.UnaryExpr):
            v = self.eval(node.expr, t)
            if isinstance(v, float):
                return -v
            if isinstance(v, str):
                raise EvalError("unary minus on a string")
            return check_unique(
                [e._replace(labels=drop_name(e.labels), value=-e.value) for e in v], "-"
            )
        if isinstance(node, pp.Call):
            fn = FUNCTIONS[node.func.name]
            out = fn(self, list(node.args), t)
            if isinstance(out, list):
                check_unique(out, node.func.name + "()")
            return out
        if isinstance(node, pp.AggregateExpr):
            op = str(node.op)
            param = self.eval_scalar(node.param, t) if node.param is not None else None
            return aggregate(op, node.modifier, param, self.eval_vector(node.expr, t))
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node, t)
        raise EvalError(f"cannot evaluate {type(node).__name__}")

    def _binary(self, node: Any, t: float) -> Value:
        op = str(node.op)
        m = binops.Matching(node.modifier, op)
        lhs = self.eval(node.lhs, t)
        rhs = self.eval(node.rhs, t)
        if isinstance(lhs, float) and isinstance(rhs, float):
            return binops.scalar_op(op, lhs, rhs, m.return_bool)
        if isinstance(lhs, list) and isinstance(rhs, float):
            out = binops.vector_scalar(op, lhs, rhs, False, m.return_bool)
        elif isinstance(lhs, float) and isinstance(rhs, list):
            out = binops.vector_scalar(op, rhs, lhs, True, m.return_bool)
        elif isinstance(lhs, list) and isinstance(rhs, list):
            out = binops.vector_vector(op, m, lhs, rhs)
        else:
            raise EvalError(f"operator {op} on strings")
        return check_unique(out, f"operator {op}")
