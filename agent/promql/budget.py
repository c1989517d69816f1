"""A bound on the work of one evaluation, so one rule or one query never stalls the agent.

The agent evaluates rules and serves ``/api/v1/query`` on its event loop, and an
expression's cost has no bound of its own: nested subqueries multiply
(``max_over_time(max_over_time(vector(1)[1h:1s])[1h:1s])`` is 13 million inner
evaluations), and a ``query_range`` multiplies again. So every evaluation (one
rule at one tick, one instant query, one whole range query) gets an
:class:`EvalBudget` of work units and a deadline:

- a sample a range selector reads costs 1 unit; a node evaluated at one
  instant, an element of its result, a series key a selector scans and a step
  of a subquery or a range query cost ``ITEM_UNITS`` (several samples' worth of
  CPU: docs/benchmarks.md). Every operator's work is proportional to these, so
  the count bounds the time, deterministically;
- nested subqueries are priced before they run (:func:`min_work`);
- the deadline (wall clock) is the safety net for work the units price badly.

Past either the evaluation raises an :class:`EvalError`: the rule is marked
failed, and the query API answers as Prometheus does for ``query.max-samples``
(``execution``, 422) and ``query.timeout`` (``timeout``, 503).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import promql_parser as pp

from kcops.agent.promql.model import EvalError, duration_ms

# Measured in docs/benchmarks.md ("Rule evaluation budget"): the packaged alert
# table over 1 h of 1 s samples for 8 GPUs needs about 1 % of it for its
# costliest rule; spending all of it takes well under a second.
DEFAULT_MAX_WORK = 4_000_000
DEFAULT_TIMEOUT_S = 1.0
ITEM_UNITS = 4
_CHECK_EVERY = 4096  # units between looks at the clock


class QueryTooExpensive(EvalError):
    """More work than the budget allows (Prometheus: ``query.max-samples``)."""


class QueryTimeout(EvalError):
    """Past the evaluation's deadline (Prometheus: ``query.timeout``)."""


class SharedBudgetSpent(QueryTimeout):
    """Past a deadline shared with other evaluations (the tick's rules, the query API's)."""


@dataclass(frozen=True)
class Limits:
    """The bound of one evaluation: ``max_work`` units and ``timeout_s`` seconds."""

    max_work: int = DEFAULT_MAX_WORK
    timeout_s: float = DEFAULT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_work < 1 or not self.timeout_s > 0:
            raise ValueError(f"limits must be positive, got {self}")


class EvalBudget:
    """The work left to one evaluation; :meth:`charge` raises once it is spent."""

    __slots__ = ("_check_at", "_deadline", "_shared", "limits", "used")

    def __init__(self, limits: Limits, deadline: float | None = None) -> None:
        """``deadline`` (``time.perf_counter()`` seconds): a bound shared with other
        evaluations, the agent's per-tick rule budget or the query API's slice of the
        loop; the evaluation stops at whichever of it and its own timeout comes first."""
        self.limits = limits
        self.used = 0
        own = time.perf_counter() + limits.timeout_s
        self._shared = deadline is not None and deadline < own
        self._deadline = deadline if deadline is not None and deadline < own else own
        self._check_at = _CHECK_EVERY

    @property
    def remaining(self) -> int:
        return self.limits.max_work - self.used

    def charge(self, units: int) -> None:
        """Count ``units`` of work; raises :class:`QueryTooExpensive` / :class:`QueryTimeout`."""
        self.used += units
        if self.used > self.limits.max_work:
            raise QueryTooExpensive(
                f"query too expensive: more than {self.limits.max_work} units of work "
                "(nodes evaluated per instant, series scanned, samples read, subquery and "
                "range steps); narrow the selectors, shorten the ranges or coarsen the "
                "subquery steps"
            )
        if self.used >= self._check_at:
            self._check_at = self.used + _CHECK_EVERY
            self.check_deadline()

    def require(self, units: int, what: str) -> None:
        """Refuse at once (:class:`QueryTooExpensive`) work of ``units`` or more that cannot fit."""
        if units > self.remaining:
            raise QueryTooExpensive(
                f"query too expensive: {what} needs at least {units} units of work, "
                f"{max(self.remaining, 0)} are left of {self.limits.max_work}; coarsen "
                "the subquery steps or shorten their ranges"
            )

    def check_deadline(self) -> None:
        if time.perf_counter() > self._deadline:
            if self._shared:
                raise SharedBudgetSpent(
                    "query timed out in expression evaluation: the shared evaluation "
                    "budget (of this tick's rules, or of the query API's slice of the "
                    "event loop) is spent"
                )
            raise QueryTimeout(
                f"query timed out in expression evaluation (after {self.limits.timeout_s:g}s)"
            )


def min_work(node: pp.Expr | None, default_step_ms: int) -> int:
    """A lower bound of the units one evaluation of ``node`` charges: its subquery steps.

    Each step of a subquery evaluates the inner expression once (one node,
    ``ITEM_UNITS``, plus what that costs), and a subquery has at least
    ``range // step`` steps; everything else is counted as free. So nested
    subqueries are priced by the product of their steps before any runs.
    """
    if isinstance(node, pp.SubqueryExpr):
        step_ms = duration_ms(node.step) if node.step else default_step_ms
        range_ms = duration_ms(node.range)
        steps = range_ms // step_ms if step_ms > 0 else 0
        return steps * (ITEM_UNITS + min_work(node.expr, default_step_ms))
    if isinstance(node, pp.Call):
        return sum(min_work(a, default_step_ms) for a in node.args)
    if isinstance(node, pp.BinaryExpr):
        return min_work(node.lhs, default_step_ms) + min_work(node.rhs, default_step_ms)
    if isinstance(node, pp.AggregateExpr):
        param = min_work(node.param, default_step_ms) if node.param is not None else 0
        return param + min_work(node.expr, default_step_ms)
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        return min_work(node.expr, default_step_ms)
    return 0
