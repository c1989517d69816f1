"""Evaluates a parsed (and subset-checked) PromQL expression at one instant over the store."""

from __future__ import annotations

from array import array

import promql_parser as pp

from kcops.agent.promql import binops
from kcops.agent.promql.aggregations import aggregate
from kcops.agent.promql.budget import ITEM_UNITS, EvalBudget, Limits, min_work
from kcops.agent.promql.functions import FUNCTIONS, RangeSeries
from kcops.agent.promql.model import (
    Elem,
    EvalError,
    Labels,
    Value,
    Vector,
    check_unique,
    drop_name,
    duration_ms,
)
from kcops.agent.promql.selectors import LOOKBACK_S, CompiledSelector, SeriesSource
from kcops.agent.store import Store

DEFAULT_STEP_S = 60.0


class Evaluator:
    """``Evaluator(store).run(node, t)`` -> float (scalar), str or a vector.

    Each :meth:`run` (or :meth:`begin`, for several instants of one range
    query) starts a fresh :class:`EvalBudget` of ``limits``; past it the
    evaluation raises an :class:`EvalError` (see budget.py). Selectors are
    compiled on first use and cached by node identity, so keep the parsed
    nodes alive (the rule objects do).
    """

    def __init__(
        self,
        store: Store,
        lookback_s: float = LOOKBACK_S,
        default_step_s: float = DEFAULT_STEP_S,
        limits: Limits | None = None,
    ) -> None:
        self.source = SeriesSource(store, lookback_s, item_units=ITEM_UNITS)
        self.source.charge = self.charge
        self.limits = limits or Limits()
        self.budget = EvalBudget(self.limits)
        # A subquery without a step (x[5m:]) steps at the global evaluation
        # interval in Prometheus; 1m is its default.
        self.default_step_ms = round(default_step_s * 1000)
        self._selectors: dict[int, tuple[pp.VectorSelector, CompiledSelector]] = {}

    def begin(self, deadline: float | None = None) -> EvalBudget:
        """Start a fresh budget: one per rule evaluation, instant query or range query.
        ``deadline``: a shared bound (``time.perf_counter()`` seconds), see EvalBudget."""
        self.budget = EvalBudget(self.limits, deadline)
        return self.budget

    def run(self, node: pp.Expr, t: float, deadline: float | None = None) -> Value:
        """Evaluate ``node`` at ``t`` under a fresh budget; raises :class:`EvalError`."""
        self.begin(deadline).require(ITEM_UNITS + self.min_work(node), "the expression")
        return self.eval(node, t)

    def min_work(self, node: pp.Expr) -> int:
        """A lower bound of the units one evaluation of ``node`` costs (budget.min_work)."""
        return min_work(node, self.default_step_ms)

    def charge(self, units: int) -> None:
        self.budget.charge(units)

    def _selector(self, vs: pp.VectorSelector) -> CompiledSelector:
        got = self._selectors.get(id(vs))
        if got is None or got[0] is not vs:
            got = (vs, CompiledSelector(vs))
            self._selectors[id(vs)] = got
        return got[1]

    # -- typed helpers used by functions ------------------------------------

    def eval_vector(self, node: pp.Expr, t: float) -> Vector:
        v = self.eval(node, t)
        if not isinstance(v, list):
            raise EvalError(f"expected an instant vector, got {type(v).__name__}")
        return v

    def eval_scalar(self, node: pp.Expr, t: float) -> float:
        v = self.eval(node, t)
        if not isinstance(v, float):
            raise EvalError(f"expected a scalar, got {type(v).__name__}")
        return v

    def eval_range(self, node: pp.Expr, t: float) -> tuple[RangeSeries, float, float, float]:
        while isinstance(node, pp.ParenExpr):
            node = node.expr
        if isinstance(node, pp.SubqueryExpr):
            return self._subquery(node, t)
        if not isinstance(node, pp.MatrixSelector):
            raise EvalError("expected a range vector selector or a subquery")
        sel = self._selector(node.vector_selector)
        range_s = node.range.total_seconds()
        end = t - sel.offset_s
        return self.source.range(sel, t, range_s), end - range_s, end, range_s

    def eval_stamped(self, node: pp.Expr, t: float) -> list[tuple[Elem, float]]:
        """An instant vector with each sample's time: its own for a plain selector, else ``t``."""
        inner = node
        while isinstance(inner, pp.ParenExpr):
            inner = inner.expr
        if isinstance(inner, pp.VectorSelector):
            return self.source.instant_stamped(self._selector(inner), t)
        return [(e, t) for e in self.eval_vector(node, t)]

    def _subquery(self, node: pp.SubqueryExpr, t: float) -> tuple[RangeSeries, float, float, float]:
        """Evaluate ``expr[range:step] offset o`` as Prometheus 2.42 does.

        The inner expression runs at every multiple of the step (in Unix ms)
        in ``[t - o - range, t - o]``; its results form the range vector.
        """
        step_ms = duration_ms(node.step) if node.step else self.default_step_ms
        if step_ms <= 0:
            raise EvalError("subquery step must be positive")
        range_ms = duration_ms(node.range)
        offset_ms = duration_ms(node.offset)
        end_ms = round(t * 1000) - offset_ms
        start_ms = -((range_ms - end_ms) // step_ms) * step_ms  # first multiple >= end - range
        steps = (end_ms - start_ms) // step_ms + 1
        per_step = ITEM_UNITS + self.min_work(node.expr)
        self.budget.require(steps * per_step, f"a subquery of {steps} steps")
        self.budget.charge(steps * ITEM_UNITS)
        acc: dict[Labels, tuple[array, array]] = {}
        for ts_ms in range(start_ms, end_ms + 1, step_ms):
            ts = ts_ms / 1000
            v = self.eval(node.expr, ts)
            if isinstance(v, str):
                raise EvalError("a subquery of a string is not allowed")
            elems = [Elem((), v)] if isinstance(v, float) else v
            self.budget.charge(len(elems) * ITEM_UNITS)
            for e in elems:
                got = acc.get(e.labels)
                if got is None:
                    got = acc[e.labels] = (array("d"), array("d"))
                got[0].append(ts)
                got[1].append(e.value)
        series: RangeSeries = [(lab, tv[0], tv[1]) for lab, tv in acc.items()]
        range_s = range_ms / 1000
        return series, (end_ms - range_ms) / 1000, end_ms / 1000, range_s

    # -- the tree walk ---------------------------------------------------------

    def eval(self, node: pp.Expr, t: float) -> Value:
        """Evaluate ``node`` at ``t`` within the current budget (started by :meth:`run`).

        Charges one unit for the node and one per element of its result: the
        work of every operator and function is proportional to the elements
        it takes in, which its operands' results were charged for.
        """
        self.budget.charge(ITEM_UNITS)
        out = self._eval(node, t)
        if isinstance(out, list):
            self.budget.charge(len(out) * ITEM_UNITS)
        return out

    def _eval(self, node: pp.Expr, t: float) -> Value:
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
            param: float | str | None = None
            if op == "count_values":
                if node.param is None:
                    raise EvalError("count_values needs a label name")
                label = self.eval(node.param, t)
                if not isinstance(label, str):
                    raise EvalError("count_values: the label name must be a string")
                param = label
            elif node.param is not None:
                param = self.eval_scalar(node.param, t)
            return aggregate(op, node.modifier, param, self.eval_vector(node.expr, t))
        if isinstance(node, pp.SubqueryExpr | pp.MatrixSelector):
            raise EvalError("a range vector cannot be the result of an expression here")
        if isinstance(node, pp.BinaryExpr):
            return self._binary(node, t)
        raise EvalError(f"cannot evaluate {type(node).__name__}")

    def _binary(self, node: pp.BinaryExpr, t: float) -> Value:
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
