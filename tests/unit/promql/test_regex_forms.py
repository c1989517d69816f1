"""Regexes Go allows and the parser's Rust check refuses, raw strings, and Go's refusals.

What promtool 2.42 itself accepts and matches is judged in
tests/integration/test_promtool_regex.py; these are the hand-checked cases.
"""

from __future__ import annotations

import promql_parser as pp
import pytest

from kcops.agent.promql.literals import MARK, quote, regex_of, requote_raw, string_literals
from kcops.agent.promql.model import RuleError, UnsupportedExpr
from kcops.agent.promql.parse import parse_expr
from kcops.agent.promql.regex import go_refusal
from kcops.agent.promql.selectors import CompiledSelector


def matches(expr: str, value: str) -> bool:
    node = parse_expr(expr)
    sel = CompiledSelector(node)
    return all(fn(value) for label, fn in sel.matchers if label == "v")


@pytest.mark.parametrize(
    ("expr", "yes", "no"),
    [
        (r'x{v=~"[\\w-.]+"}', ["host-1.example", "a_b"], ["a b", ""]),
        (r'x{v=~"[\\d-z]"}', ["-", "5", "z"], ["a", "y"]),
        (r'x{v=~"a\\056c"}', ["a.c"], ["abc"]),
        (r'x{v=~"\\141bc"}', ["abc"], ["141bc"]),
        (r'x{v=~"\\0"}', ["\x00"], ["0", ""]),
        (r'x{v=~"[[]"}', ["["], ["]", "[]"]),
        (r'x{v=~"\\Q.\\E"}', ["."], ["a"]),
        (r'x{v=~"(?i)\\Qprod\\E.*"}', ["PROD-1", "prod"], ["pro"]),
        (r'x{v=~"(?i)\\w{1000}"}', ["A" * 1000], ["A" * 999]),
        # Raw strings keep their backslashes, as in Prometheus.
        (r"x{v=~`a\.b`}", ["a.b"], ["axb"]),
        (r"x{v=~`[\w-.]+\.example`}", ["host-1.example"], ["host-1xexample"]),
        (r'x{v!~"[\\w-.]*"}', ["a b"], ["ab", ""]),
    ],
)
def test_re2_forms_the_rust_check_refuses_work(expr: str, yes: list[str], no: list[str]) -> None:
    assert [matches(expr, v) for v in yes] == [True] * len(yes)
    assert [matches(expr, v) for v in no] == [False] * len(no)


@pytest.mark.parametrize(
    "expr",
    [r'{v=~"[\\w-.]*"}', r'{v!~"[\\w-.]+"}', r'{v=~"\\Q\\E|[[]"}', r'{a=~"[\\d-z]?"}'],
)
def test_a_hidden_regex_that_matches_empty_is_still_an_empty_matcher(expr: str) -> None:
    # Prometheus: "vector selector must contain at least one non-empty matcher".
    with pytest.raises(RuleError, match="at least one non-empty matcher"):
        parse_expr(expr)


def test_a_label_replace_raw_regex_and_template() -> None:
    node = parse_expr(r'label_replace(x, "d", `$1`, "v", `([\w-.]+)\.example`)')
    assert [a.val for a in node.args[1:]] == ["d", "$1", "v", r"([\w-.]+)\.example"]


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        # RE2 refuses a regex the Rust check refused too: RE2's reason and offset.
        (r'x{v=~"[\\w-.](?=b)"}', r"invalid perl operator: \(\?= at offset 6"),
        (r'x{v=~"(?P<é>a)"}', "invalid named capture: \\(\\?P<é> at offset 0"),
        (r'x{v=~"[\\w-](?P<a-b>x)"}', "invalid named capture: \\(\\?P<a-b> at offset 5"),
        (r'x{v=~"\\pL{1000}"}', "pattern too large: RE2 compiles it to more than its 8 MiB"),
        ('x{v=~"\\x00kcops-regex:41"}', "kcops reserves it"),
        ('x{v=~"\\u0000kcops-regex:41"}', "kcops reserves it"),
        ('x{a="1" or b="2"}', "'or' between label matchers is not supported"),
        ("x{v=~`[\\w-.]+`, w=~'(?<n>x)'}", r"unsupported Perl syntax: \(\?< at offset 0"),
    ],
)
def test_refused_regexes_say_why_and_where(expr: str, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        parse_expr(expr)


def test_or_matchers_are_unsupported_not_misread() -> None:
    with pytest.raises(UnsupportedExpr):
        parse_expr('x{a="1" or b="2"}')


@pytest.mark.parametrize(
    ("pattern", "want"),
    [
        ("(?P<é>a)", ("invalid named capture: (?P<é>", 0)),
        ("a(?P<>b)", ("invalid named capture: (?P<>", 1)),
        ("(?P<a_1>a)", None),
        ("(?<x>a)", ("invalid or unsupported Perl syntax: (?<", 0)),
        ("(?<=a)", None),  # RE2 refuses it with its own reason
        ("[(?<]", None),
        ("[]](?<x>)", ("invalid or unsupported Perl syntax: (?<", 3)),
        ("[^]]", None),
        ("[[:alpha:](?<]", None),
        ("\\Q(?<x>\\C\\E", None),
        ("\\Q(?<x>", None),
        ("\\\\C", None),
        ("\\\\\\C", ("invalid escape sequence: \\C", 2)),
        ("[\\C]", ("invalid escape sequence: \\C", 1)),
        ("\\((?<x>)", ("invalid or unsupported Perl syntax: (?<", 2)),
    ],
)
def test_go_refusals_skip_literal_text(pattern: str, want: tuple[str, int] | None) -> None:
    assert go_refusal(pattern) == want


def test_string_literals_skip_comments_and_escaped_quotes() -> None:
    text = 'x{a="q\\"#", b=~\'c\'} # "not a literal\nor on() y{c!~ `r\\`}'
    lits = string_literals(text)
    assert lits is not None
    assert [text[s.start : s.end] for s in lits] == ['"q\\"#"', "'c'", "`r\\`"]
    assert [s.regex_operand for s in lits] == [False, True, True]
    commented = string_literals('x{a= # =~\n "v", b =~ "w"}')
    assert commented is not None and [s.regex_operand for s in commented] == [False, True]
    assert string_literals('x{a="unclosed}') is None
    assert string_literals('x{a="new\nline"}') is None


@pytest.mark.parametrize("value", ["a\\b", '"', "'", "a\nb", "\t", "é😀", "\\x41", "\x7f"])
def test_requoting_a_raw_string_keeps_its_value(value: str) -> None:
    raw = "`" + value + "`"
    lits = string_literals(raw)
    assert lits is not None
    assert pp.parse(requote_raw(raw, lits)).val == value
    assert pp.parse(quote(value)).val == value


def test_placeholders_read_back_and_other_values_pass_through() -> None:
    assert regex_of(MARK + b"[w".hex()) == "[w"
    assert regex_of(MARK + b"a*".hex() + "|") == "a*"
    assert regex_of("a.*") == "a.*"
