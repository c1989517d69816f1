"""Checks on an expression's text before it reaches the PromQL parser.

promql-parser is Rust: deep nesting overflows its stack and a duration past
its range panics, and neither can be caught as an error. Every path that
parses (the rule file, the loader, the query API) runs this check first.
"""

from __future__ import annotations

import re

from kcops.agent.duration import MAX_SECONDS
from kcops.agent.yamlload import excerpt

MAX_EXPR_CHARS = 16384
# Operators plus bracket nesting of one expression. The PromQL parser and the
# evaluator recurse once per level; a few thousand levels crash the parser
# (a 5,000-term sum is enough), so the bound is checked on the text, before it
# is parsed. The packaged rules use at most 10.
MAX_EXPR_DEPTH = 128

_OPERATOR = re.compile(r"==|!=|<=|>=|[-+*/%^<>]|\b(?:and|or|unless|atan2)\b")
# A duration written as a number of seconds: in a range or subquery, or after `offset`.
_BRACKETS = re.compile(r"\[([^\[\]]*)\]")
_OFFSET = re.compile(r"\boffset\s+-?\s*([^\s()\[\]]+)", re.I)
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`|#[^\n]*', re.S)


def check_expr_text(text: str) -> str:
    """Refuse, before parsing, an expression the parser or the evaluator cannot take: too long,
    too deep to recurse through, or a number of seconds past a duration's range (the parser
    panics on those)."""
    if len(text) > MAX_EXPR_CHARS:
        raise ValueError(f"an expression has at most {MAX_EXPR_CHARS} characters")
    bare = _QUOTED.sub('""', text)
    depth = deepest = 0
    for c in bare:
        if c in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in ")]}":
            depth -= 1
    durations = [p for m in _BRACKETS.finditer(bare) for p in m.group(1).split(":")]
    for number in [d.strip() for d in durations] + _OFFSET.findall(bare):
        if not _NUMBER.fullmatch(number):
            continue
        value = int(number, 16) if number[:2].lower() == "0x" else float(number)
        # promql-parser panics (a Rust panic, not an error) past ~1.8e19 s; Prometheus
        # bounds durations at (2**63 - 1) ns.
        if not value <= MAX_SECONDS:
            raise ValueError(f"duration out of range: {excerpt(number)} s (at most 292y)")
    if deepest + len(_OPERATOR.findall(bare)) > MAX_EXPR_DEPTH:
        raise ValueError(
            f"expression too complex: more than {MAX_EXPR_DEPTH} operators and nested "
            "brackets (split it into recording rules)"
        )
    return text
