"""The PromQL-subset evaluator, table-driven over small stores (promtool 2.42 semantics)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import pytest

from kcops.agent.promql.evaluator import Evaluator
from kcops.agent.promql.model import EvalError, UnsupportedExpr
from kcops.agent.promql.parse import parse_expr
from kcops.agent.samples import STALE_NAN, SeriesKey
from kcops.agent.store import Store

Series = Mapping[str, Sequence[tuple[float, float]]]


def store_of(series: Series) -> Store:
    st = Store(retention_s=1e9)
    for text, samples in series.items():
        name, _, rest = text.partition("{")
        labels = dict(p.split("=") for p in rest.rstrip("}").split(",") if p) if rest else {}
        for t, v in samples:
            st.append(SeriesKey.of(name, labels), t, v)
    return st


def ev(expr: str, t: float, series: Series) -> dict[str, float]:
    out = Evaluator(store_of(series)).run(parse_expr(expr), t)
    if isinstance(out, float):
        return {"scalar": out}
    assert isinstance(out, list)
    return {",".join(f"{k}={v}" for k, v in e.labels): e.value for e in out}


G = {"g{a=1}": [(0, 1.0), (60, 2.0)], "g{a=2}": [(0, 10.0), (60, 20.0)]}


@pytest.mark.parametrize(
    ("expr", "t", "want"),
    [
        # lookback: closed at 5m in Prometheus 2.x, so a sample exactly 300s old counts
        ("g", 360, {"__name__=g,a=1": 2.0, "__name__=g,a=2": 20.0}),
        ("g", 361, {}),
        ("g offset 1m", 60, {"__name__=g,a=1": 1.0, "__name__=g,a=2": 10.0}),
        ('g{a!="1"}', 60, {"__name__=g,a=2": 20.0}),
        ('g{a=~"1|3"}', 60, {"__name__=g,a=1": 2.0}),
        ('g{a!~"1"}', 60, {"__name__=g,a=2": 20.0}),
        ('{__name__="g", a="2"}', 60, {"__name__=g,a=2": 20.0}),
        ("sum(g)", 60, {"": 22.0}),
        ("sum by (a) (g) * 2", 60, {"a=1": 4.0, "a=2": 40.0}),
        ("max without (a) (g)", 60, {"": 20.0}),
        ("count(g > 1)", 60, {"": 2.0}),
        ("topk(1, g)", 60, {"__name__=g,a=2": 20.0}),
        ("bottomk(1, g)", 60, {"__name__=g,a=1": 2.0}),
        ("quantile(0.5, g)", 60, {"": 11.0}),
        ("g > 5", 60, {"__name__=g,a=2": 20.0}),
        ("g > bool 5", 60, {"a=1": 0.0, "a=2": 1.0}),
        ("5 < g", 60, {"__name__=g,a=2": 20.0}),
        ("g - 1", 60, {"a=1": 1.0, "a=2": 19.0}),
        ("1 + 2 * 3", 0, {"scalar": 7.0}),
        ('absent(nosuch{x="y"})', 0, {"x=y": 1.0}),
        ("absent(g)", 0, {}),
        ("abs(-g)", 60, {"a=1": 2.0, "a=2": 20.0}),
        ("clamp_max(g, 5)", 60, {"a=1": 2.0, "a=2": 5.0}),
        ("avg_over_time(g[1m])", 60, {"a=1": 1.5, "a=2": 15.0}),
        ("last_over_time(g[1m])", 60, {"__name__=g,a=1": 2.0, "__name__=g,a=2": 20.0}),
        ("count_over_time(g[59s])", 60, {"a=1": 1.0, "a=2": 1.0}),
        ('g and on (a) g{a="1"}', 60, {"__name__=g,a=1": 2.0}),
        ('g unless g{a="1"}', 60, {"__name__=g,a=2": 20.0}),
        ('g{a="1"} or g', 60, {"__name__=g,a=1": 2.0, "__name__=g,a=2": 20.0}),
    ],
)
def test_expressions(expr: str, t: float, want: dict[str, float]) -> None:
    assert ev(expr, t, G) == want


def test_staleness_marker_ends_a_series_and_is_not_nan() -> None:
    series = {"g": [(0, 1.0), (30, STALE_NAN)], "h": [(0, math.nan)]}
    assert ev("g", 29, series) == {"__name__=g": 1.0}
    assert ev("g", 30, series) == {}
    assert math.isnan(ev("h", 10, series)["__name__=h"])
    assert ev("count_over_time(g[1m])", 30, series) == {"": 1.0}


def test_rate_extrapolates_and_handles_counter_resets() -> None:
    # 4 samples 15s apart in a 60s window: extrapolated to the window edges.
    series = {"c": [(15, 10.0), (30, 20.0), (45, 30.0), (60, 40.0)]}
    assert ev("increase(c[1m])", 60, series) == {"": pytest.approx(40.0)}
    assert ev("rate(c[1m])", 60, series) == {"": pytest.approx(40.0 / 60)}
    reset = {"c": [(15, 10.0), (30, 20.0), (45, 5.0), (60, 15.0)]}
    # 10 + (20 -> reset -> 5: +5) + 10 = 25 over 45s, extrapolated by 60/45.
    assert ev("increase(c[1m])", 60, reset) == {"": pytest.approx(25.0 * 60 / 45)}
    assert ev("delta(c[1m])", 60, reset) == {"": pytest.approx(5.0 * 60 / 45)}
    assert ev("irate(c[1m])", 60, reset) == {"": pytest.approx(10.0 / 15)}
    assert ev("rate(c[1m])", 60, {"c": [(60, 1.0)]}) == {}


def test_rate_does_not_extrapolate_below_zero() -> None:
    series = {"c": [(30, 1.0), (45, 11.0), (60, 21.0)]}
    # the zero point lies 1.5s before the first sample: extrapolate only that far.
    assert ev("increase(c[1m])", 60, series) == {"": pytest.approx(20.0 * (30 + 1.5) / 30)}


def test_histogram_quantile_interpolates_within_the_bucket() -> None:
    b = "h_bucket{le=%s}"
    series = {b % "0.1": [(0, 50.0)], b % "0.5": [(0, 90.0)], b % "+Inf": [(0, 100.0)]}
    assert ev("histogram_quantile(0.5, h_bucket)", 0, series) == {"": pytest.approx(0.1 * 50 / 50)}
    assert ev("histogram_quantile(0.8, h_bucket)", 0, series) == {
        "": pytest.approx(0.1 + 0.4 * (80 - 50) / 40)
    }
    # beyond the last finite bucket: its upper bound
    assert ev("histogram_quantile(0.99, h_bucket)", 0, series) == {"": 0.5}
    no_inf = {b % "0.1": [(0, 1.0)]}
    assert math.isnan(ev("histogram_quantile(0.5, h_bucket)", 0, no_inf)[""])


def test_vector_matching_group_left_and_errors() -> None:
    series = {
        "req{pod=p1,svc=s}": [(0, 2.0)],
        "req{pod=p2,svc=s}": [(0, 6.0)],
        "tot{svc=s,team=t}": [(0, 8.0)],
    }
    got = ev("req / on (svc) group_left (team) tot", 0, series)
    assert got == {"pod=p1,svc=s,team=t": 0.25, "pod=p2,svc=s,team=t": 0.75}
    with pytest.raises(EvalError, match="many-to-one matching must be explicit"):
        ev("req / on (svc) tot", 0, series)
    with pytest.raises(EvalError, match="many-to-many matching not allowed"):
        ev("tot / on (svc) req", 0, series)
    with pytest.raises(EvalError, match="same labelset"):
        ev("abs({__name__=~'req|tot'})", 0, {"req": [(0, 1.0)], "tot": [(0, 2.0)]})


def test_division_by_zero_follows_ieee() -> None:
    series = {"g{a=1}": [(0, 1.0)], "g{a=0}": [(0, 0.0)]}
    got = ev("g / 0", 0, series)
    assert got["a=1"] == math.inf
    assert math.isnan(got["a=0"])


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        # Functions and aggregations newer than Prometheus 2.42 (the reference).
        ("mad_over_time(g[5m])", "function 'mad_over_time' is not supported"),
        ("histogram_count(g)", "function 'histogram_count'"),
        ("limitk(1, g)", "aggregation 'limitk'"),
        ("g @ 100", "@ modifier"),
        ("rate(g[5m:1m] @ 100)", "@ modifier"),
    ],
)
def test_outside_the_subset_is_refused_with_its_name(expr: str, needle: str) -> None:
    with pytest.raises(UnsupportedExpr, match=needle):
        parse_expr(expr)
