"""Regular expressions with Prometheus's semantics: RE2 syntax, anchored at both ends.

Prometheus compiles a label matcher's (and ``label_replace``'s) regex with Go's
``regexp`` as ``^(?:<re>)$``; Python's ``re`` differs on its syntax, ``$`` and
``.``, so kcops compiles with Google's RE2 binding (``google-re2``), the library
Go's package reimplements, and refuses the few things RE2 (C++) accepts and Go
does not (``\\C``, ``(?<name>``, capture names that are not ASCII word characters).

Bounds: a pattern is at most :data:`MAX_REGEX_CHARS` characters; a rule's
program at most :data:`RULE_MAX_MEM` (RE2's default), a query's at most
:data:`QUERY_MAX_MEM`, since RE2 compiles holding the GIL in time proportional
to the program (0.64 s for an 8 MiB one). A query compiles its regexes only
until its deadline (:func:`query_bounds`); programs are cached by bytes
(regexcache.py).
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import re2

from kcops.agent.promql.budget import QueryTimeout
from kcops.agent.promql.model import RuleError
from kcops.agent.promql.regexcache import RegexCache, estimate_bytes

MAX_REGEX_CHARS = 10_000
RULE_MAX_MEM = 8 << 20  # RE2's default
QUERY_MAX_MEM = 2 << 20
# The process's compiled programs (rules and queries share them), by (pattern, max_mem).
CACHE = RegexCache()
# The deadline (time.perf_counter() s) of the query API evaluation running in this
# context, if any: its regexes get QUERY_MAX_MEM and compile only until it.
_QUERY_DEADLINE: ContextVar[float | None] = ContextVar("kcops_query_deadline", default=None)

_CAPTURE_NAME = re.compile(r"[A-Za-z0-9_]+")


def _options(max_mem: int) -> Any:
    opts = re2.Options()
    opts.log_errors = False  # RE2 would print every refused pattern to stderr
    opts.max_mem = max_mem
    return opts


_OPTIONS = {RULE_MAX_MEM: _options(RULE_MAX_MEM), QUERY_MAX_MEM: _options(QUERY_MAX_MEM)}


@contextmanager
def query_bounds(deadline: float) -> Iterator[None]:
    """Within it, regexes are a query's: programs of at most :data:`QUERY_MAX_MEM`,
    compiled only until ``deadline`` (``time.perf_counter()`` s), past which
    :func:`compile_anchored` raises :class:`QueryTimeout` for a regex not cached."""
    token = _QUERY_DEADLINE.set(deadline)
    try:
        yield
    finally:
        _QUERY_DEADLINE.reset(token)


def _position(pattern: str, fragment: str) -> int:
    pos = pattern.find(fragment) if fragment else -1
    return pos if pos >= 0 else 0


def compile_anchored(pattern: str) -> Any:
    """The RE2 regex ``^(?:pattern)$``; raises :class:`RuleError` naming the position.

    Cached (:data:`CACHE`, bounded by bytes): the same pattern compiles once
    however many rules and queries use it, while it stays among the recently used.
    """
    deadline = _QUERY_DEADLINE.get()
    max_mem = RULE_MAX_MEM if deadline is None else QUERY_MAX_MEM
    key = (pattern, max_mem)
    rx = CACHE.get(key)
    if rx is not None:
        return rx
    if deadline is not None and time.perf_counter() > deadline:
        raise QueryTimeout(
            "query timed out compiling its regexes: the query API's share of the event "
            "loop is spent; use fewer or smaller regexes"
        )
    try:
        rx = _compile(pattern, max_mem)
    finally:
        # re2.compile keeps its own unbounded-by-size LRU of 128 programs (up to 1 GiB
        # by its docs): empty it, so CACHE alone holds programs.
        re2.purge()
    CACHE.put(key, rx, estimate_bytes(pattern, rx, max_mem))
    return rx


def _compile(pattern: str, max_mem: int) -> Any:
    if len(pattern) > MAX_REGEX_CHARS:
        raise RuleError(
            f"regex is {len(pattern)} characters; kcops allows at most {MAX_REGEX_CHARS} "
            "in one regex"
        )
    refused = go_refusal(pattern)
    if refused is not None:
        message, pos = refused
        raise RuleError(f"invalid regex {_excerpt(pattern)}: {message} at offset {pos}")
    try:
        return re2.compile("^(?:" + pattern + ")$", _OPTIONS[max_mem])
    except re2.error as exc:
        raw = exc.args[0] if exc.args else ""
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if text.startswith("pattern too large"):
            raise RuleError(_too_large(pattern, max_mem)) from None
        reason, _, fragment = text.partition(": ")
        if fragment.startswith("^(?:"):
            # RE2 quotes the whole anchored pattern: show the user's part.
            fragment = fragment[4:].removesuffix(")$")
            text = f"{reason}: {fragment}"
        pos = _position(pattern, fragment)
        raise RuleError(f"invalid regex {_excerpt(pattern)}: {text} at offset {pos}") from None


def _too_large(pattern: str, max_mem: int) -> str:
    head = f"invalid regex {_excerpt(pattern)}: pattern too large: RE2 compiles it to more than"
    if max_mem == QUERY_MAX_MEM:
        return (
            f"{head} the query API's {QUERY_MAX_MEM >> 20} MiB program limit (a rule may use "
            f"{RULE_MAX_MEM >> 20} MiB); a large class such as \\pL repeated over about 100 "
            "times (docs/rules.md)"
        )
    return (
        f"{head} its {max_mem >> 20} MiB limit (a large class such as \\pL repeated hundreds "
        "of times); Prometheus accepts it, kcops refuses it (docs/rules.md)"
    )


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
