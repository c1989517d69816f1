"""String literals of a PromQL text, found and rewritten before promql-parser reads it.

promql-parser differs from Prometheus 2.42 in two places that are about
string literals, and both are repaired here by rewriting the text it parses:

- a backquoted (raw) string with a backslash (`` `a\\.b` ``) is refused with
  "unknown escape sequence": the parser checks escapes that a raw string does
  not have. :func:`requote_raw` rewrites it as the double-quoted literal of the
  same value.
- a regex matcher is checked with Rust's ``regex`` crate, which refuses what
  Go's RE2 syntax allows (``[\\w-.]``, octal escapes, ``[[]``, ``\\Q...\\E``,
  large repeats). :func:`hide_regexes` puts a placeholder literal in place of
  each ``=~`` / ``!~`` operand; :func:`regex_of` reads the regex back from a
  matcher's value. The placeholder matches the empty string exactly when the
  regex does, so the parser's "at least one non-empty matcher" check is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# A placeholder literal's value: MARK, the regex as UTF-8 in hex, then "|"
# when the regex matches the empty string. The NUL keeps it from anything a
# rule writes by accident; a rule that writes it on purpose is refused.
MARK = "\x00kcops-regex:"


@dataclass(frozen=True)
class Literal:
    start: int  # offset of the opening quote
    end: int  # offset after the closing quote
    quote: str  # '"', "'" or "`"
    regex_operand: bool  # right of =~ or !~


def string_literals(text: str) -> list[Literal] | None:
    """The string literals of ``text``, or None when one is not closed (the parser says why)."""
    out: list[Literal] = []
    i, n = 0, len(text)
    last = ""  # the last two characters outside strings, comments and spaces
    while i < n:
        c = text[i]
        if c == "#":  # a comment, to the end of the line
            j = text.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if c not in "\"'`":
            if c not in " \t\r\n":
                last = (last + c)[-2:]
            i += 1
            continue
        j = i + 1
        while j < n and text[j] != c:
            if text[j] == "\n" and c != "`":
                return None
            j += 2 if text[j] == "\\" and c != "`" else 1
        if j >= n:
            return None
        out.append(Literal(i, j + 1, c, last in ("=~", "!~")))
        last = ""
        i = j + 1
    return out


def quote(value: str) -> str:
    """A double-quoted PromQL literal whose value is ``value``."""
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _replace(text: str, spans: list[tuple[int, int, str]]) -> str:
    parts, last = [], 0
    for start, end, new in spans:
        parts += [text[last:start], new]
        last = end
    parts.append(text[last:])
    return "".join(parts)


def requote_raw(text: str, literals: list[Literal]) -> str:
    """``text`` with every raw string that holds a backslash double-quoted instead."""
    spans = [
        (lit.start, lit.end, quote(text[lit.start + 1 : lit.end - 1]))
        for lit in literals
        if lit.quote == "`" and "\\" in text[lit.start : lit.end]
    ]
    return _replace(text, spans) if spans else text


def hide_regexes(
    text: str,
    literals: list[Literal],
    value_of: Callable[[str], str],
    matches_empty: Callable[[str], bool],
) -> str:
    """``text`` with each regex operand replaced by its placeholder literal.

    ``value_of`` decodes a literal's source text; ``matches_empty`` says
    whether a regex matches the empty string (it raises for a bad regex).
    """
    spans = []
    for lit in literals:
        if not lit.regex_operand:
            continue
        regex = value_of(text[lit.start : lit.end])
        hidden = MARK + regex.encode().hex() + ("|" if matches_empty(regex) else "")
        spans.append((lit.start, lit.end, quote(hidden)))
    return _replace(text, spans)


def regex_of(value: str) -> str:
    """A regex matcher's regex: its value, or what its placeholder stands for."""
    if not value.startswith(MARK):
        return value
    return bytes.fromhex(value[len(MARK) :].removesuffix("|")).decode()
