"""The one duration type: Prometheus's ``model.Duration`` grammar and range.

Used by the rule loader (``for``, ``keep_firing_for``, ``verify``, promtool
test files), the CLI (``--since``) and wherever config takes a duration, so
that what ``kcops alerts check`` accepts is what promtool accepts: units
``y w d h m s ms`` in that order, each at most once, integers only
(``1.5m`` is refused, as Prometheus does), ``0`` alone allowed, and no more
than Prometheus's int64 milliseconds (``99999999999999999999y`` is refused).
"""

from __future__ import annotations

import re
from typing import Any

_GRAMMAR = re.compile(
    r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$"
)
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
MAX_MS = 2**63 - 1  # Prometheus keeps a duration as int64 milliseconds


class DurationError(ValueError):
    """Not a Prometheus duration, or out of its range."""


def parse_duration(text: Any) -> float:
    """Seconds of a Prometheus duration (``1m30s``, ``500ms``, ``0``); DurationError if bad."""
    if isinstance(text, int) and not isinstance(text, bool) and text == 0:
        return 0.0
    if not isinstance(text, str) or not text:
        raise DurationError(f"not a duration: {str(text)[:40]!r} (e.g. 30s, 1m30s, 500ms)")
    if text == "0":
        return 0.0
    m = _GRAMMAR.match(text)
    if m is None or not any(m.groups()):
        raise DurationError(
            f'not a valid duration string: "{text[:40]}" (units y w d h m s ms, in that '
            "order, integers only)"
        )
    ms = 0
    for g, unit in zip(m.groups(), _UNIT_MS, strict=True):
        if g:
            ms += int(g) * unit
            if ms > MAX_MS:
                raise DurationError(f'duration out of range: "{text[:40]}" (max about 292y)')
    return ms / 1000.0
