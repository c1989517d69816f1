"""Functions over range vectors: rate and friends, ``*_over_time``.

Each takes the samples of one series in the window (timestamps in seconds,
staleness markers already dropped) and returns a value or None (no output).
Times are compared in integer milliseconds, as Prometheus does, so the
extrapolation matches it bit for bit.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence


def _ms(t: float) -> int:
    return round(t * 1000)


def extrapolated_rate(
    ts: array,
    vs: array,
    range_start: float,
    range_end: float,
    range_s: float,
    is_counter: bool,
    is_rate: bool,
) -> float | None:
    """Prometheus's extrapolatedRate (promql/functions.go, 2.x)."""
    n = len(vs)
    if n < 2:
        return None
    result = vs[-1] - vs[0]
    if is_counter:
        prev = vs[0]
        for i in range(1, n):
            cur = vs[i]
            if cur < prev:
                result += prev
            prev = cur
    first_ms, last_ms = _ms(ts[0]), _ms(ts[-1])
    duration_to_start = (first_ms - _ms(range_start)) / 1000
    duration_to_end = (_ms(range_end) - last_ms) / 1000
    sampled = (last_ms - first_ms) / 1000
    avg_between = sampled / (n - 1)
    if is_counter and result > 0 and vs[0] >= 0:
        duration_to_zero = sampled * (vs[0] / result)
        if duration_to_zero < duration_to_start:
            duration_to_start = duration_to_zero
    threshold = avg_between * 1.1
    interval = sampled
    interval += duration_to_start if duration_to_start < threshold else avg_between / 2
    interval += duration_to_end if duration_to_end < threshold else avg_between / 2
    factor = interval / sampled
    if is_rate:
        factor /= range_s
    return result * factor


def instant_rate(ts: array, vs: array, is_rate: bool) -> float | None:
    """irate / idelta: the last two samples."""
    if len(vs) < 2:
        return None
    last, prev = vs[-1], vs[-2]
    result = last if is_rate and last < prev else last - prev
    interval_ms = _ms(ts[-1]) - _ms(ts[-2])
    if interval_ms == 0:
        return None
    if is_rate:
        result /= interval_ms / 1000
    return result


def kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """One step of Kahan-Babuska (Neumaier) summation, as Prometheus's kahanSumInc."""
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def mean_stays_inf(mean: float, v: float) -> bool:
    """True when a running mean that is already ±Inf is left as it is by ``v``:
    Prometheus's avg and avg_over_time skip the update then (same-signed Inf or a
    finite value), so the mean only turns NaN on NaN or the opposite Inf."""
    if not math.isinf(mean):
        return False
    if math.isinf(v):
        return (mean > 0) == (v > 0)
    return not math.isnan(v)


def avg_over_time(vs: Sequence[float]) -> float:
    mean = 0.0
    c = 0.0
    count = 0.0
    for v in vs:
        count += 1
        if mean_stays_inf(mean, v):
            continue
        mean, c = kahan_inc(v / count - mean / count, mean, c)
    if math.isinf(mean):
        return mean
    return mean + c


def min_over_time(vs: Sequence[float]) -> float:
    out = vs[0]
    for v in vs:
        if v < out or math.isnan(out):
            out = v
    return out


def max_over_time(vs: Sequence[float]) -> float:
    out = vs[0]
    for v in vs:
        if v > out or math.isnan(out):
            out = v
    return out


def sum_over_time(vs: Sequence[float]) -> float:
    total = 0.0
    c = 0.0
    for v in vs:
        total, c = kahan_inc(v, total, c)
    if math.isinf(total):
        return total
    return total + c


def stdvar_over_time(vs: Sequence[float]) -> float:
    count = 0.0
    mean = c_mean = 0.0
    aux = c_aux = 0.0
    for v in vs:
        count += 1
        delta = v - (mean + c_mean)
        mean, c_mean = kahan_inc(delta / count, mean, c_mean)
        aux, c_aux = kahan_inc(delta * (v - (mean + c_mean)), aux, c_aux)
    return (aux + c_aux) / count


def stddev_over_time(vs: Sequence[float]) -> float:
    return math.sqrt(stdvar_over_time(vs))


def changes(vs: Sequence[float]) -> float:
    n = 0
    prev = vs[0]
    for v in vs[1:]:
        if not (v == prev or (math.isnan(v) and math.isnan(prev))):
            n += 1
        prev = v
    return float(n)


def resets(vs: Sequence[float]) -> float:
    n = 0
    prev = vs[0]
    for v in vs[1:]:
        if v < prev:
            n += 1
        prev = v
    return float(n)


def quantile_edge(q: float) -> float | None:
    """What every Prometheus quantile answers for a ``q`` outside [0, 1] (NaN, -Inf or
    +Inf), before looking at any value; None for a ``q`` inside."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    return None


def quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus's quantile(): linear interpolation between closest ranks; NaN sorts first."""
    if not values:
        return math.nan
    edge = quantile_edge(q)
    if edge is not None:
        return edge
    vals = sorted(values, key=lambda v: (not math.isnan(v), v if not math.isnan(v) else 0.0))
    n = float(len(vals))
    rank = q * (n - 1)
    lower = max(0.0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return vals[int(lower)] * (1 - weight) + vals[int(upper)] * weight


def go_div(a: float, b: float) -> float:
    """Go's float64 ``a / b``: division by zero gives ±Inf or NaN, never raises."""
    if b == 0:
        if a == 0 or math.isnan(a):
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def linear_regression(
    ts: Sequence[float], vs: Sequence[float], intercept_s: float
) -> tuple[float, float]:
    """Prometheus's linearRegression: (slope per second, value at ``intercept_s``).

    Times in integer milliseconds relative to the intercept, Kahan sums, and
    a constant series answered exactly (slope 0), as promql/functions.go does.
    """
    n = 0.0
    sum_x = c_x = sum_y = c_y = sum_xy = c_xy = sum_x2 = c_x2 = 0.0
    init_y = vs[0]
    const_y = True
    icpt_ms = _ms(intercept_s)
    for i, (t, v) in enumerate(zip(ts, vs, strict=True)):
        if const_y and i > 0 and v != init_y:
            const_y = False
        n += 1.0
        x = (_ms(t) - icpt_ms) / 1e3
        sum_x, c_x = kahan_inc(x, sum_x, c_x)
        sum_y, c_y = kahan_inc(v, sum_y, c_y)
        sum_xy, c_xy = kahan_inc(x * v, sum_xy, c_xy)
        sum_x2, c_x2 = kahan_inc(x * x, sum_x2, c_x2)
    if const_y:
        if math.isinf(init_y):
            return math.nan, math.nan
        return 0.0, init_y
    sum_x += c_x
    sum_y += c_y
    sum_xy += c_xy
    sum_x2 += c_x2
    cov_xy = sum_xy - sum_x * sum_y / n
    var_x = sum_x2 - sum_x * sum_x / n
    slope = go_div(cov_xy, var_x)
    intercept = sum_y / n - slope * sum_x / n
    return slope, intercept


def deriv(ts: Sequence[float], vs: Sequence[float]) -> float | None:
    if len(vs) < 2:
        return None
    return linear_regression(ts, vs, ts[0])[0]


def predict_linear(
    ts: Sequence[float], vs: Sequence[float], t: float, ahead_s: float
) -> float | None:
    """The value ``ahead_s`` seconds after the evaluation time ``t``, by least squares."""
    if len(vs) < 2:
        return None
    slope, intercept = linear_regression(ts, vs, t)
    return slope * ahead_s + intercept
