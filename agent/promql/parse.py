"""Parse PromQL with promql-parser and refuse anything outside kcops's subset.

The check runs at load, so an unsupported expression is refused with the name
of what it uses and is never evaluated wrongly.
"""

from __future__ import annotations

import promql_parser as pp

from kcops.agent.promql.exprguard import check_expr_text
from kcops.agent.promql.functions import FUNCTIONS
from kcops.agent.promql.literals import (
    MARK,
    Literal,
    hide_regexes,
    regex_of,
    requote_raw,
    string_literals,
)
from kcops.agent.promql.model import RuleError, UnsupportedExpr
from kcops.agent.promql.regex import compile_anchored, full_match

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


def parse_expr(text: str) -> pp.Expr:
    """Parse ``text`` and check it against the subset; raises :class:`RuleError`.

    Regex matchers are judged by RE2 (Prometheus's syntax), never by the
    parser's Rust engine: the regexes are hidden behind placeholders before
    the text is parsed (literals.py). The text is
    checked first (exprguard.py): what would crash the parser never reaches it.
    """
    try:
        check_expr_text(text)
    except ValueError as exc:
        raise RuleError(str(exc)) from None
    literals = string_literals(text)
    if literals is not None:
        requoted = requote_raw(text, literals)
        if requoted is not text:
            text, literals = requoted, string_literals(requoted)
        _refuse_reserved(text, literals or [])
    if literals is not None and any(lit.regex_operand for lit in literals):
        # Parsed with placeholders from the start, not only when the Rust engine refuses
        # a regex: it compiles each one first, holding the GIL without a bound (25 ms for
        # \pL{100}, 160 ms for (?i)\w{1000}; 180 of them held the loop for 4.4 s), where
        # RE2 compiles within the bounds of regex.py.
        text = hide_regexes(text, literals, _value, _matches_empty)
    try:
        node = pp.parse(text)
    except ValueError as exc:
        raise RuleError(f"cannot parse expression: {exc}") from None
    check_subset(node)
    return node


def _value(source: str) -> str:
    """The value of one string literal, decoded as the parser decodes it."""
    try:
        node = pp.parse(source)
    except ValueError as exc:
        raise RuleError(f"cannot parse expression: {exc}") from None
    assert isinstance(node, pp.StringLiteral)
    return str(node.val)


def _matches_empty(regex: str) -> bool:
    return full_match(compile_anchored(regex), "")


# How a literal can write the NUL with which the placeholder mark begins.
_NUL_FORMS = ("\x00", r"\x00", r"\000", r"\u0000", r"\U00000000")


def _refuse_reserved(text: str, literals: list[Literal]) -> None:
    if not any(form in text for form in _NUL_FORMS):
        return
    for lit in literals:
        if lit.regex_operand and _value(text[lit.start : lit.end]).startswith(MARK):
            raise RuleError(
                f"a regex may not begin with {MARK!r}: kcops reserves it for placeholders"
            )


def _check_selector(node: pp.VectorSelector) -> None:
    if node.at is not None:
        raise UnsupportedExpr("the @ modifier is not supported by kcops")
    if node.matchers.or_matchers:
        # Prometheus 3 syntax, which promql-parser follows; 2.42 refuses it.
        raise UnsupportedExpr(
            "'or' between label matchers is not supported (Prometheus 2.42 has no such syntax)"
        )
    for m in node.matchers.matchers:
        if m.op in (pp.MatchOp.Re, pp.MatchOp.NotRe):
            compile_anchored(regex_of(m.value))


def check_subset(node: pp.Expr) -> None:
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
