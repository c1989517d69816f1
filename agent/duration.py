"""The one duration type: Prometheus's ``model.Duration`` grammar and range.

Used by the rule loader, the configuration (every ``*_s`` field that is a length
of time, through :data:`Duration`) and the CLI, so that what ``kcops alerts
check`` accepts is what promtool accepts: units ``y w d h m s ms`` in that
order, integers only (``1.5m`` is refused), ``0`` alone allowed, and at most
what Go's ``time.Duration`` holds, about 292 years.
"""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_GRAMMAR = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_MS_NS = 1_000_000
_UNIT_NS = tuple(
    ms * _MS_NS for ms in (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
)
# Go's time.Duration, which Prometheus's model.ParseDuration bounds the sum by.
MAX_NS = 2**63 - 1
MAX_SECONDS = MAX_NS / 1e9
_SHOWN = 40
_NUMBER = re.compile(r"^[+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


class DurationError(ValueError):
    """Not a Prometheus duration, or out of its range."""


def _shown(text: str) -> str:
    return f'"{text[:_SHOWN]}..."' if len(text) > _SHOWN else f'"{text}"'


def parse_duration(text: object) -> float:
    """Seconds of a Prometheus duration (``1m30s``, ``500ms``, ``0``); DurationError if bad.

    The sum is bounded like ``model.ParseDuration``: each term and the total at
    most (2**63 - 1) ns.
    """
    if isinstance(text, int) and not isinstance(text, bool) and text == 0:
        return 0.0
    if not isinstance(text, str) or not text:
        shown = _shown(text) if isinstance(text, str) else type(text).__name__
        raise DurationError(f"not a duration: {shown} (e.g. 30s, 1m30s, 500ms)")
    if text == "0":
        return 0.0
    m = _GRAMMAR.fullmatch(text)
    if m is None or not any(m.groups()):
        raise DurationError(
            f"not a valid duration string: {_shown(text)} (units y w d h m s ms, in that "
            "order, integers only)"
        )
    total_ns = 0
    for digits, unit_ns in zip(m.groups(), _UNIT_NS, strict=True):
        if not digits:
            continue
        digits = digits.lstrip("0") or "0"
        # More than 19 digits is past int64 in any unit; int() of thousands of
        # digits would also be slow, so it never sees them.
        if len(digits) > 19 or int(digits) > (1 << 63) // unit_ns:
            raise DurationError(f"duration out of range: {_shown(text)} (at most 292y)")
        total_ns += int(digits) * unit_ns
        if total_ns > MAX_NS:
            raise DurationError(f"duration out of range: {_shown(text)} (at most 292y)")
    return total_ns / 1e9


def seconds(value: object) -> float:
    """A length of time from config or a flag: a number of seconds or a Prometheus duration.

    ``90``, ``1.5`` and ``"1.5"`` are seconds (a config written before durations
    were accepted keeps working); ``"1m30s"`` is Prometheus's grammar. Booleans,
    negative, non-finite and out-of-range values raise :class:`DurationError`.
    """
    if isinstance(value, bool):
        raise DurationError("a boolean is not a duration (e.g. 30, 1.5, 30s, 1m30s)")
    if isinstance(value, str) and _NUMBER.fullmatch(value.strip()):
        value = float(value.strip())
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise DurationError(f"not a duration: {value!r} (a finite number of seconds, >= 0)")
        if value > MAX_SECONDS:
            raise DurationError(f"duration out of range: {value!r} s (at most 292y)")
        return float(value)
    if isinstance(value, str) and value and not _GRAMMAR.fullmatch(value):
        shown = repr(value[:_SHOWN]) + ("..." if len(value) > _SHOWN else "")
        raise DurationError(
            f"not a duration: {shown} (a number of seconds, or a Prometheus duration: "
            "e.g. 1.5, 30s, 1m30s, 500ms)"
        )
    return parse_duration(value)


def format_duration(s: float) -> str:
    """Prometheus's short form of ``s`` seconds (``1h30m``, ``500ms``, ``0s``)."""
    ms = round(s * 1000)
    if ms == 0:
        return "0s"
    out = []
    for unit, size in (("y", 365 * 86_400_000), ("w", 7 * 86_400_000), ("d", 86_400_000),
                       ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):  # fmt: skip
        if ms >= size:
            out.append(f"{ms // size}{unit}")
            ms %= size
    return "".join(out)


# The pydantic type of a config field that is a length of time in seconds: it
# accepts what :func:`seconds` does and holds a float of seconds; bounds go on
# the field (``Field(ge=..., le=...)``).
Duration = Annotated[float, BeforeValidator(seconds)]
