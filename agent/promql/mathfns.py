"""Element-wise math and calendar functions, with Go's float semantics.

Python's ``math`` raises where Go's returns a value (``acos(2)`` is NaN,
``atanh(1)`` is +Inf, ``cosh(1000)`` is +Inf), so each function here maps
those cases to Go's answer. Calendar functions read Unix seconds as Go's
``time.Unix(int64(v), 0).UTC()`` does, with Go's own calendar arithmetic
(no ``datetime`` range limit, and Go's answer for NaN or huge values).
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


U64 = 2**64
_ABS_ZERO_YEAR = -292277022399
_UNIX_TO_INTERNAL = (1969 * 365 + 1969 // 4 - 1969 // 100 + 1969 // 400) * 86400
_INTERNAL_TO_ABS = (1 - _ABS_ZERO_YEAR) * 31556952  # Go: -(absoluteZeroYear - 1) * 365.2425 days
_DAYS_BEFORE = (0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334, 365)


def _wrap64(v: int) -> int:
    v %= U64
    return v - U64 if v >= 2**63 else v


def civil(seconds: int) -> tuple[int, int, int, int, int, int, int]:
    """(year, month, day, hour, minute, weekday 0=Sunday, day of year 1..366), UTC.

    Go's time package arithmetic (absDate, in uint64 from year -292277022399),
    so even the absurd dates of ``int64(NaN)`` come out as Prometheus's.
    """
    abs_s = (seconds + _UNIX_TO_INTERNAL + _INTERNAL_TO_ABS) % U64
    d = abs_s // 86400
    n = d // 146097
    y = 400 * n
    d -= 146097 * n
    n = d // 36524
    n -= n >> 2
    y += 100 * n
    d -= 36524 * n
    n = d // 1461
    y += 4 * n
    d -= 1461 * n
    n = d // 365
    n -= n >> 2
    y += n
    d -= 365 * n
    year = _wrap64(_wrap64(y) + _ABS_ZERO_YEAR)
    hour = abs_s % 86400 // 3600
    minute = abs_s % 3600 // 60
    weekday = (abs_s + 86400) % 604800 // 86400
    day = d
    if _leap(year):
        if day == 59:
            return year, 2, 29, hour, minute, weekday, d + 1
        if day > 59:
            day -= 1
    month = day // 31
    end = _DAYS_BEFORE[month + 1]
    if day >= end:
        month += 1
        begin = end
    else:
        begin = _DAYS_BEFORE[month]
    return year, month + 1, day - begin + 1, hour, minute, weekday, d + 1


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
    "day_of_year": _field(6),
    "days_in_month": lambda s: float(days_in_month(*civil(s)[:2])),
}
