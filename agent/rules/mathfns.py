"""Element-wise math and calendar functions, with Go's float semantics.

Python's ``math`` raises where Go's returns a value (``acos(2)`` is NaN,
``atanh(1)`` is +Inf, ``cosh(1000)`` is +Inf), so each function here maps
those cases to Go's answer. Calendar functions read Unix seconds as Go's
``time.Unix(int64(v), 0).UTC()`` does, with a proleptic Gregorian calendar
computed on integers (no ``datetime`` range limit).
"""

from __future__ import annotations

import math
from collections.abc import Callable

INT64_MIN = -(2**63)


def _go_fallback(name: str, v: float) -> float:
    if name == "atanh" and abs(v) == 1.0:
        return math.copysign(math.inf, v)
    if name == "cosh":
        return math.inf
    if name == "sinh":
        return math.copysign(math.inf, v)
    return math.nan  # acos/asin/acosh/atanh out of domain, sin/cos/tan of ±Inf


def _go(name: str) -> Callable[[float], float]:
    op: Callable[[float], float] = getattr(math, name)

    def fn(v: float) -> float:
        try:
            return op(v)
        except (ValueError, OverflowError):
            return _go_fallback(name, v)

    return fn


def sgn(v: float) -> float:
    # Go: -1 below zero, 1 above, else v itself (so NaN and -0 stay).
    if v < 0:
        return -1.0
    if v > 0:
        return 1.0
    return v


def deg(v: float) -> float:
    return v * 180 / math.pi


def rad(v: float) -> float:
    return v * math.pi / 180


TRIG: dict[str, Callable[[float], float]] = {
    name: _go(name)
    for name in (
        "acos",
        "acosh",
        "asin",
        "asinh",
        "atan",
        "atanh",
        "cos",
        "cosh",
        "sin",
        "sinh",
        "tan",
        "tanh",
    )
}
TRIG.update({"sgn": sgn, "deg": deg, "rad": rad})


# -- calendar -----------------------------------------------------------------


def go_int64(v: float) -> int:
    """Go's ``int64(v)`` on amd64: truncation; NaN and out of range give INT64_MIN."""
    if not math.isfinite(v) or not (-(2.0**63) <= v < 2.0**63):
        return INT64_MIN
    return int(v)


def civil(seconds: int) -> tuple[int, int, int, int, int, int]:
    """(year, month, day, hour, minute, weekday 0=Sunday) of Unix ``seconds``, UTC."""
    days, rem = divmod(seconds, 86400)
    hour, minute = rem // 3600, rem % 3600 // 60
    weekday = (days + 4) % 7  # 1970-01-01 was a Thursday
    # Howard Hinnant's civil_from_days.
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    return (y + 1 if m <= 2 else y), m, d, hour, minute, weekday


def _leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def days_in_month(y: int, m: int) -> int:
    if m == 2:
        return 29 if _leap(y) else 28
    return 30 if m in (4, 6, 9, 11) else 31


def _field(i: int) -> Callable[[int], float]:
    return lambda s: float(civil(s)[i])


CALENDAR: dict[str, Callable[[int], float]] = {
    "year": _field(0),
    "month": _field(1),
    "day_of_month": _field(2),
    "hour": _field(3),
    "minute": _field(4),
    "day_of_week": _field(5),
    "days_in_month": lambda s: float(days_in_month(*civil(s)[:2])),
}
