"""Parse PromQL with promql-parser and refuse anything outside kcops's subset.

The check runs at load, so an unsupported expression is refused with the name
of what it uses and is never evaluated wrongly.
"""

from __future__ import annotations

from typing import Any

import promql_parser as pp

from kcops.agent.rules.functions import FUNCTIONS
from kcops.agent.rules.model import RuleError, UnsupportedExpr

AGGREGATIONS = frozenset(
    {
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "quantile",
        "topk",
        "bottomk",
        "stddev",
        "stdvar",
        "group",
    }
)
BINARY_OPS = frozenset(
    {"+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless"}
)


def parse_expr(text: str) -> Any:
    """Parse ``text`` and check it against the subset; raises :class:`RuleError`."""
    try:
        node = pp.parse(text)
    except ValueError as exc:
        raise RuleError(f"cannot parse expression: {exc}") from None
    check_subset(node)
    return node


def check_subset(node: Any) -> None:
    if isinstance(node, pp.VectorSelector):
        if node.at is not None:
            raise UnsupportedExpr("the @ modifier is not supported by kcops")
    elif isinstance(node, pp.MatrixSelector):
        check_subset(node.vector_selector)
    elif isinstance(node, pp.SubqueryExpr):
        raise UnsupportedExpr("subqueries are not supported by kcops")
    elif isinstance(node, pp.Call):
        name = node.func.name
        if name not in FUNCTIONS:
            allowed = ", ".join(sorted(FUNCTIONS))
            raise UnsupportedExpr(
                f"function '{name}' is not supported by kcops (supported: {allowed})"
            )
        for arg in node.args:
            check_subset(arg)
    elif isinstance(node, pp.AggregateExpr):
        op = str(node.op)
        if op not in AGGREGATIONS:
            allowed = ", ".join(sorted(AGGREGATIONS))
            raise UnsupportedExpr(
                f"aggregation '{op}' is not supported by kcops (supported: {allowed})"
            )
        if node.param is not None:
            check_subset(node.param)
        check_subset(node.expr)
    elif isinstance(node, pp.BinaryExpr):
        op = str(node.op)
        if op not in BINARY_OPS:
            raise UnsupportedExpr(f"binary operator '{op}' is not supported by kcops")
        check_subset(node.lhs)
        check_subset(node.rhs)
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr):
        check_subset(node.expr)
    elif isinstance(node, pp.NumberLiteral | pp.StringLiteral):
        return
    else:
        raise UnsupportedExpr(f"expression node {type(node).__name__} is not supported by kcops")
