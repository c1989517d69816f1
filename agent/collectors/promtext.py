"""Prometheus text exposition: cheap pre-filter, then prometheus-client's parser.

An engine's ``/metrics`` holds hundreds of series of which an adapter maps a
few dozen. Parsing everything with prometheus-client costs ~12 µs a line, so
lines are first selected by metric name (a dict lookup each) and only the
selected ones go through the real parser. The pre-filter still checks that
every line *looks* like exposition text, so an HTML error page or a truncated
body is refused instead of silently yielding nothing.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection

from prometheus_client.parser import text_string_to_metric_families

from kcops.agent.samples import ParsedSample
from kcops.errors import CollectorUnavailable

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_gcount", "_gsum")


class ExpositionError(CollectorUnavailable):
    """The page is not Prometheus text, or it is cut short."""

    def __init__(self, message: str, reason: str = "parse") -> None:
        super().__init__(message, reason=reason)


def family_base(name: str) -> str:
    """``foo_bucket`` -> ``foo``; names without a known suffix are their own base."""
    for suf in _SUFFIXES:
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def metric_names(text: str) -> set[str]:
    """Base names of every family on the page (for auto-detection); checks the syntax lightly."""
    out: set[str] = set()
    for name, _line in _iter_lines(text):
        out.add(family_base(name))
    return out


def _iter_lines(text: str):  # type: ignore[no-untyped-def]
    """(sample or family name, line) for every non-blank line; raises on garbage."""
    for i, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("TYPE", "HELP"):
                yield parts[2], line
            continue
        m = _NAME.match(line)
        if m is None or m.end() >= len(line) or line[m.end()] not in "{ \t":
            raise ExpositionError(f"not Prometheus text at line {i}: {line[:60]!r}")
        yield m.group(0), line


def _check_ending(text: str) -> None:
    if text and not text.endswith("\n"):
        # Garbage first (an HTML page has no final newline either), then "cut short".
        cut = text.rfind("\n") + 1
        for _ in _iter_lines(text[:cut]):
            pass
        tail = text[cut:].lstrip()
        if not tail.startswith("#") and _NAME.match(tail) is None:
            raise ExpositionError(f"not Prometheus text: {tail[:60]!r}")
        raise ExpositionError("exposition ends in the middle of a line", reason="truncated")


def _parse_lines(lines: list[str]) -> list[ParsedSample]:
    """One sample per line, through prometheus-client's parser."""
    out: list[ParsedSample] = []
    try:
        for fam in text_string_to_metric_families("\n".join(lines) + "\n"):
            for s in fam.samples:
                out.append(ParsedSample(s.name, s.labels, float(s.value)))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise ExpositionError(f"not Prometheus text: {exc}") from None
    if len(out) != len(lines):
        raise ExpositionError(f"not Prometheus text: {len(lines)} lines gave {len(out)} samples")
    return out


def _split(line: str) -> tuple[str | None, str]:
    """(series text, value text) of a sample line; (None, "") when it carries a timestamp.

    The series is the name and its label block: up to the last ``}`` (label values may
    hold one, the value and timestamp never do), or the first token without labels.
    """
    end = line.rfind("}") + 1
    if end:
        rest = line[end:].split()
        return (line[:end], rest[0]) if len(rest) == 1 else (None, "")
    parts = line.split()
    return (parts[0], parts[1]) if len(parts) == 2 else (None, "")


def _revalue(seen: ParsedSample, value: str) -> ParsedSample | None:
    """``seen`` with the value ``value`` as prometheus-client reads it; None if it would not."""
    if "_" in value:
        return None  # float() takes 1_000, the exposition format does not
    try:
        v = float(value)
    except ValueError:
        return None
    if v == seen.value or (math.isnan(v) and math.isnan(seen.value)):
        return seen
    return ParsedSample(seen.name, seen.labels, v)


def _check_histograms(samples: list[ParsedSample]) -> None:
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    inf: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    for s in samples:
        if s.name.endswith("_bucket") and "le" in s.labels:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")))
            series.add(key)
            if s.labels["le"] == "+Inf":
                inf.add(key)
    missing = series - inf
    if missing:
        name = next(iter(missing))[0][: -len("_bucket")]
        raise ExpositionError(
            f"histogram {name} has no +Inf bucket (page cut short?)", reason="truncated"
        )


class Parser:
    """Parses pages of one engine, remembering the series it has parsed before.

    Between two scrapes the series of a page stay the same while values move.
    The memo is keyed by a line's text before its value (name and labels): a
    line whose series was seen costs a ``float()`` of its value; only new
    series (and lines with a timestamp) go through prometheus-client's parser.
    The memo holds the previous page's series only.
    """

    def __init__(self) -> None:
        self._memo: dict[str, ParsedSample] = {}
        # Sample name -> wanted?, for the previous page's names and ``_picked_for``: a
        # page repeats its names every scrape, so each is judged once, not once a line.
        self._picked: dict[str, bool] = {}
        self._picked_for: frozenset[str] | None = None

    def _select(self, text: str, wanted: Collection[str] | None) -> list[str]:
        """The sample lines of ``text`` whose family is in ``wanted`` (all when None)."""
        # Only a frozenset cannot change between two calls: anything else is read afresh.
        same = isinstance(wanted, frozenset) and wanted is self._picked_for
        old = self._picked if same else {}
        self._picked_for = wanted if isinstance(wanted, frozenset) else None
        picked: dict[str, bool] = {}
        lines = []
        for name, line in _iter_lines(text):
            if line[0] == "#":
                continue
            take = picked.get(name)
            if take is None:
                take = old.get(name)
                if take is None:
                    take = wanted is None or family_base(name) in wanted or name in wanted
                picked[name] = take
            if take:
                lines.append(line)
        self._picked = picked  # this page's names only: memory stays one page
        return lines

    def parse(self, text: str, wanted: Collection[str] | None = None) -> list[ParsedSample]:
        """Samples of the families in ``wanted`` (base names; None = all).

        Raises :class:`ExpositionError` (reason ``parse`` or ``truncated``) for a
        page that is not exposition text, ends in the middle of a line, or holds
        a histogram without its ``+Inf`` bucket.
        """
        _check_ending(text)
        lines = self._select(text, wanted)
        memo = self._memo
        out: list[ParsedSample | None] = []
        heads: list[str | None] = []
        misses: list[int] = []
        for line in lines:
            head, value = _split(line)
            seen = memo.get(head) if head is not None else None
            got = _revalue(seen, value) if seen is not None else None
            if got is None:
                misses.append(len(out))
            out.append(got)
            heads.append(head)
        if misses:
            parsed = _parse_lines([lines[i] for i in misses])
            for i, sample in zip(misses, parsed, strict=True):
                out[i] = sample
                if heads[i] is not None and _revalue(sample, _split(lines[i])[1]) is not sample:
                    heads[i] = None  # the parser read the value differently: do not remember
        done = [s for s in out if s is not None]
        _check_histograms(done)
        # Keep only this page's series: memory stays one page, whatever changes.
        self._memo = {h: s for h, s in zip(heads, done, strict=True) if h is not None}
        return done


def parse(text: str, wanted: Collection[str] | None = None) -> list[ParsedSample]:
    """:meth:`Parser.parse` without memory between calls."""
    return Parser().parse(text, wanted)
