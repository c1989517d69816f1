"""Times for people: local ISO 8601 with the offset, and how long ago.

Every command that prints a time prints it through here, so no command shows
raw Unix seconds; ``--json`` output keeps the numbers for scripts.
"""

from __future__ import annotations

import math
import time
from datetime import datetime


def local_iso(ts: float | None) -> str:
    """``2026-12-01T03:04:05+01:00`` in the local zone; ``-`` for no time."""
    if ts is None or not math.isfinite(ts) or ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")


def duration(seconds: float) -> str:
    """A short span: ``42s``, ``3m``, ``3m05s``, ``2h04m``, ``3d02h``."""
    if not math.isfinite(seconds):
        return "?"
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    m, sec = divmod(s, 60)
    if m < 60:
        return f"{m}m{sec:02d}s" if sec and m < 10 else f"{m}m"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def ago(ts: float | None, now: float | None = None) -> str:
    """``3m ago`` (or ``in 3m`` for a time ahead); ``never`` for no time."""
    if ts is None or not math.isfinite(ts) or ts <= 0:
        return "never"
    now = time.time() if now is None else now
    delta = now - ts
    return f"{duration(delta)} ago" if delta >= 0 else f"in {duration(-delta)}"


def when(ts: float | None, now: float | None = None) -> str:
    """Both at once: ``2026-12-01T03:04:05+01:00 (3m ago)``."""
    if ts is None or not math.isfinite(ts) or ts <= 0:
        return "never"
    return f"{local_iso(ts)} ({ago(ts, now)})"


def as_float(value: object) -> float | None:
    """A timestamp from JSON (number or numeric string), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None
