"""Parse PromQL with promql-parser and refuse anything outside kcops's subset.

The check runs at load, so an unsupported expression is refused with the name
of what it uses and is never evaluated wrongly.
"""

from __future__ import annotations

from typing import Any

import promql_parser as pp

from kcops.agent.rules.functions import FUNCTIONS
from kcops.agent.rules.model import RuleError, UnsupportedExpr
from kcops.agent.rules.regex import compile_anchored

_ILLEGAL_REGEX = "illegal regex for "

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
        "count_values",
    }
)
BINARY_OPS = frozenset(
    {"+", "-", "*", "/", "%", "^", "atan2", "==", "!=", ">", "<", ">=", "<=", "and", "or", "unless"}
)


def parse_expr(text: str) -> Any:
    """Parse ``text`` and check it against the subset; raises :class:`RuleError`."""
    try:
        node = pp.parse(text)
    except ValueError as exc:
        msg = str(exc)
        if msg.startswith(_ILLEGAL_REGEX):
            # The parser checks regexes with Rust's engine and gives no position;
            # RE2 (Prometheus's syntax) says what is wrong and where.
            compile_anchored(msg[len(_ILLEGAL_REGEX) :])
        raise RuleError(f"cannot parse expression: {msg}") from None
    check_subset(node)
    return node


def _check_selector(node: Any) -> None:
    if node.at is not None:
        raise UnsupportedExpr("the @ modifier is not supported by kcops")
    for m in node.matchers.matchers:
        if m.op in (pp.MatchOp.Re, pp.MatchOp.NotRe):
            compile_anchored(m.value)


def check_subset(node: Any) -> None:
    """Refuse (:class:`UnsupportedExpr`/:class:`RuleError`) what kcops cannot evaluate."""
    if isinstance(node, pp.VectorSelector):
        _check_selector(node)
    elif isinstance(node, pp.MatrixSelector):
        check_subset(node.vector_selector)
    elif isinstance(node, pp.SubqueryExpr):
        if node.at is not None:
            raise UnsupportedExpr("the @ modifier is not supported by kcops")
        check_subset(node.expr)
    elif isinstance(node, pp.Call):
        name = node.func.name
        if name not in FUNCTIONS:
            allowed = ", ".join(sorted(FUNCTIONS))
            raise UnsupportedExpr(
                f"function '{name}' is not supported by kcops (supported: {allowed})"
            )
        for arg in node.args:
            check_subset(arg)
        if name == "label_replace" and isinstance(node.args[4], pp.StringLiteral):
            compile_anchored(node.args[4].val)
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
