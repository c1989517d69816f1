"""Regular expressions with Prometheus's semantics: RE2 syntax, anchored at both ends.

Prometheus 2.42 compiles a label matcher's (and ``label_replace``'s) regex
with Go's ``regexp`` as ``^(?:<re>)$``: RE2 syntax (``[[:alpha:]]``, ``\\z``,
``(?i)`` inside a group; no look-around, no backreferences), ``$`` only at the
very end, and ``.`` not matching a newline. Python's ``re`` differs on all of
these, so kcops compiles with Google's RE2 binding (``google-re2``), the
library Go's package reimplements. The few places where RE2 (C++) accepts
more than Go's parser (``\\C``, ``(?<name>``, capture names that are not
ASCII word characters) are refused here, as Go refuses them.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Any

import re2

from kcops.agent.rules.model import RuleError

MAX_REGEX_CHARS = 10_000

_CAPTURE_NAME = re.compile(r"[A-Za-z0-9_]+")


def _options() -> Any:
    opts = re2.Options()
    opts.log_errors = False  # RE2 would print every refused pattern to stderr
    return opts


_OPTIONS = _options()


def _position(pattern: str, fragment: str) -> int:
    pos = pattern.find(fragment) if fragment else -1
    return pos if pos >= 0 else 0


@lru_cache(maxsize=1024)
def compile_anchored(pattern: str) -> Any:
    """The RE2 regex ``^(?:pattern)$``; raises :class:`RuleError` naming the position.

    Cached: the same pattern compiles once per process however many rules
    and queries use it.
    """
    if len(pattern) > MAX_REGEX_CHARS:
        raise RuleError(f"regex is {len(pattern)} characters; at most {MAX_REGEX_CHARS}")
    refused = go_refusal(pattern)
    if refused is not None:
        message, pos = refused
        raise RuleError(f"invalid regex {_excerpt(pattern)}: {message} at offset {pos}")
    try:
        return re2.compile("^(?:" + pattern + ")$", _OPTIONS)
    except re2.error as exc:
        raw = exc.args[0] if exc.args else ""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if text.startswith("pattern too large"):
            raise RuleError(
                f"invalid regex {_excerpt(pattern)}: pattern too large: RE2 compiles it to "
                "more than its 8 MiB limit (a large class such as \\pL repeated hundreds "
                "of times); Prometheus accepts it, kcops refuses it (docs/rules.md)"
            ) from None
        reason, _, fragment = text.partition(": ")
        if fragment.startswith("^(?:"):
            # RE2 quotes the whole anchored pattern: show the user's part.
            fragment = fragment[4:].removesuffix(")$")
            text = f"{reason}: {fragment}"
        pos = _position(pattern, fragment)
        raise RuleError(f"invalid regex {_excerpt(pattern)}: {text} at offset {pos}") from None


def go_refusal(pattern: str) -> tuple[str, int] | None:
    """What Go 1.19's regexp/syntax refuses and RE2 (C++) accepts: (Go's message, offset).

    ``\\C``, ``(?<name>`` (Go 1.22 added it) and capture names other than
    ``[A-Za-z0-9_]+``; literal text (``\\Q...\\E``, escapes, character
    classes) is skipped, as Go's parser skips it.
    """
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt == "C":
                return "invalid escape sequence: \\C", i
            if nxt == "Q" and not in_class:
                end = pattern.find("\\E", i + 2)
                i = n if end < 0 else end + 2
                continue
            i += 2
        elif in_class:
            if pattern.startswith("[:", i) and pattern.find(":]", i + 2) >= 0:
                i = pattern.find(":]", i + 2) + 2
                continue
            in_class = c != "]"
            i += 1
        elif c == "[":
            in_class = True
            i += 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)  # a ] first in a class is literal
        else:
            refused = _go_group(pattern, i)
            if refused is not None:
                return refused, i
            i += 1
    return None


def _go_group(pattern: str, i: int) -> str | None:
    if pattern.startswith("(?P<", i):
        end = pattern.find(">", i + 4)
        if end >= 0 and not _CAPTURE_NAME.fullmatch(pattern[i + 4 : end]):
            return f"invalid named capture: {pattern[i : end + 1]}"
    elif pattern.startswith("(?<", i) and not pattern.startswith(("(?<=", "(?<!"), i):
        return "invalid or unsupported Perl syntax: (?<"
    return None


def _excerpt(pattern: str) -> str:
    return repr(pattern if len(pattern) <= 60 else pattern[:57] + "...")


def full_match(rx: Any, value: str) -> bool:
    return rx.search(value) is not None


def _is_name_char(ch: str) -> bool:
    return ch == "_" or ch.isalpha() or unicodedata.category(ch) == "Nd"


def _extract(template: str) -> tuple[str, int, str] | None:
    """Go's regexp.extract: ``$name`` / ``${name}`` -> (name, number or -1, rest)."""
    if len(template) < 2 or template[0] != "$":
        return None
    brace = template[1] == "{"
    s = template[2:] if brace else template[1:]
    i = 0
    while i < len(s) and _is_name_char(s[i]):
        i += 1
    if i == 0:
        return None
    name = s[:i]
    if brace:
        if i >= len(s) or s[i] != "}":
            return None
        i += 1
    num = -1
    if (
        name.isascii()
        and name.isdigit()
        and len(name) <= 8
        and not (len(name) > 1 and name[0] == "0")
    ):
        num = int(name)
    return name, num, s[i:]


def expand(rx: Any, template: str, match: Any) -> str:
    """Go's ``Regexp.ExpandString``: ``$1``, ``${1}``, ``$name``, ``$$``.

    As in Go, ``$1x`` names the group ``1x`` (absent, so empty) and a group
    that did not take part expands to nothing.
    """
    out: list[str] = []
    names = rx.groupindex
    while template:
        i = template.find("$")
        if i < 0:
            out.append(template)
            break
        out.append(template[:i])
        template = template[i:]
        if len(template) > 1 and template[1] == "$":
            out.append("$")
            template = template[2:]
            continue
        got = _extract(template)
        if got is None:
            out.append("$")
            template = template[1:]
            continue
        name, num, template = got
        idx = num if num >= 0 else names.get(name, -1)
        if 0 <= idx <= rx.groups:
            val = match.group(idx)
            if val is not None:
                out.append(val)
    return "".join(out)
