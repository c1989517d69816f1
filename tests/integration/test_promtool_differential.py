"""Differential test: kcops's alert timeline equals promtool's on generated series.

A seeded generator makes varied input series (counter resets, gaps longer
than the 5m lookback, staleness markers, histograms, label sets coming and
going, NaN). kcops replays a fixed rule file over each case; its firing
alerts (labels and annotations with the exact ``$value``) at *every*
evaluation step become ``alert_rule_test`` expectations, and the real
``promtool test rules`` must accept them. Cases go into test files of
``BATCH`` cases, so promtool starts a few times only, and it checks one
batch while kcops computes the next.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kcops.agent.rules.engine import RuleEngine
from kcops.agent.rules.export import export_rules
from kcops.agent.rules.loader import load_rules_data
from kcops.agent.rules.promtest import PromtoolGroup, build_store, expand_values, series_key

pytestmark = pytest.mark.slow  # runs promtool over 320 cases: minutes

CASES = 120
PROMQL_CASES = 200
INTERVAL_S = 30
SAMPLES = 26
EVAL_S = 30
STEPS = 24

# (name, expr, for, keep_firing_for): one rule per feature family of the subset.
RULES: list[tuple[str, str, str, str]] = [
    ("DRate", "rate(c[1m]) > 0.05", "0s", "0s"),
    ("DIncrease", "increase(c[2m]) >= 4", "30s", "0s"),
    ("DDelta", "delta(g[1m]) > 1 or idelta(g[1m]) < -2", "0s", "30s"),
    ("DIrate", "irate(c[1m]) > 0.05 unless resets(c[2m]) > 0", "15s", "0s"),
    (
        "DOverTime",
        "avg_over_time(g[1m]) > 5 or max_over_time(g[2m]) - min_over_time(g[2m]) > 7"
        " or count_over_time(g[1m]) < 3",
        "0s",
        "0s",
    ),
    (
        "DOverTime2",
        "quantile_over_time(0.7, g[90s]) > 6 or stddev_over_time(g[1m]) > 3"
        " or sum_over_time(g[30s]) > 17 or changes(g[1m]) > 3",
        "15s",
        "0s",
    ),
    ("DLast", "last_over_time(g[2m]) < 1", "0s", "15s"),
    ("DHisto", "histogram_quantile(0.9, sum by (job, le) (rate(h_bucket[1m]))) > 0.4", "0s", "0s"),
    ("DAgg", "sum by (job) (g) > 12 or avg without (inst) (g) < 2", "15s", "0s"),
    (
        "DAgg2",
        "count by (job) (g > 4) >= 2 or max by (job) (g) - min by (job) (g) > 6"
        " or quantile by (job) (0.5, g) > 7",
        "0s",
        "0s",
    ),
    ("DTopk", "topk(1, g) > 8 or bottomk(1, g{job='a'}) < 1", "0s", "0s"),
    ("DMatch", "g / on (job) group_left sum by (job) (g) > 0.6", "0s", "0s"),
    ("DSet", "(g > bool 5) == 1 and on (job, inst) c", "0s", "0s"),
    ("DAbsent", "absent(g{job='b', inst='i2'}) or absent(nosuch)", "30s", "0s"),
    ("DMath", "abs(g - 5) > 4 or clamp_max(g, 6) >= 6 or clamp_min(g, 3) <= 3", "0s", "0s"),
    ("DOffset", "g > g offset 1m + 2", "0s", "0s"),
    ("DMatchers", "g{inst=~'i[12]', job!='b'} != 3", "15s", "15s"),
    ("DScalar", "c * 2 - 1 > 10 and c % 4 == 1", "0s", "0s"),
]

# The functions, subqueries and regex forms of issue 17, judged the same way.
RULES_PROMQL: list[tuple[str, str, str, str]] = [
    ("PSubq", "max_over_time(rate(c[1m])[3m:30s]) > 0.06", "0s", "0s"),
    (
        "PSubq2",
        "avg_over_time(g[2m:1m] offset 30s) > 6 or min_over_time((g > 3)[90s:45s]) < 4",
        "15s",
        "0s",
    ),
    ("PSubq3", "predict_linear(avg_over_time(g[1m])[3m:30s], 300) > 13", "0s", "0s"),
    ("PPredict", "predict_linear(g[2m], 300) > 14 or predict_linear(c[90s], 60) < 2", "0s", "0s"),
    ("PDeriv", "deriv(g[90s]) < -0.02 or deriv(c[2m]) > 0.07", "0s", "15s"),
    (
        "PLabelReplace",
        'label_replace(g, "host", "h-$1-${2}x", "inst", "(i)([13])") > 7',
        "0s",
        "0s",
    ),
    ("PLabelReplace2", 'label_replace(g < 4, "job", "$1z", "job", "(?i)(B)") ', "0s", "0s"),
    ("PLabelJoin", 'label_join(g > 8, "both", "/", "job", "inst", "nosuch")', "0s", "0s"),
    ("PRe2", 'g{inst=~"((?i)I)[[:digit:]]", job=~"[[:alpha:]]+\\\\z"} > 9', "0s", "0s"),
    ("PRe2b", 'g{job!~"(?i:A)", inst=~"[^[:space:]]+[[:^alpha:]]"} < 2', "0s", "0s"),
    ("PRe2c", 'c{inst=~"\\\\pL\\\\d", job=~"(?U)a.*|b"} > 60', "0s", "0s"),
    # Forms promql-parser's Rust check refuses (kcops re-parses them), and raw strings.
    (
        "PRe2d",
        'g{inst=~"[\\\\w-.]+[13]", job=~"\\\\141|[\\\\d-z]"} > 6'
        " or g{inst=~`[[]|\\Qi2\\E`, job!~`[\\w-.]*b`} < 3",
        "0s",
        "0s",
    ),
    # Nested subqueries, and one without a step (promtool: the evaluation interval).
    ("PSubq4", "min_over_time(max_over_time(g[1m:30s])[2m:30s]) > 8", "0s", "0s"),
    ("PSubq5", "max_over_time(g[2m:]) - min_over_time(g[2m:]) > 5", "15s", "0s"),
    ("PTimestamp", "time() - timestamp(g) >= 60 or timestamp(c > 50) > 600", "0s", "0s"),
    (
        "PPresent",
        "present_over_time(c[1m]) unless on (job, inst) present_over_time(g[1m])",
        "0s",
        "0s",
    ),
    (
        "PCountValues",
        'count_values by (job) ("val", g * 4) >= 1 and on (job) sum by (job) (g) > 20',
        "0s",
        "0s",
    ),
    ("PCountValues2", 'count_values without (inst) ("v", round(g)) > 1', "0s", "0s"),
    (
        "PTime",
        "g + on () group_left () (hour() + minute() + day_of_week() + month() + day_of_month()"
        " + year() + days_in_month()) > 2019",
        "0s",
        "0s",
    ),
    (
        "PTime2",
        "month(g * 2592000) > 4 or day_of_week(c * 86400) == 2 or hour(g * 3600) >= 11"
        " or year(c * 3e7) > 2030 or days_in_month(g * 2592000) == 28"
        " or day_of_month(g * 86400) == 10 or minute(c * 60) == 7 or day_of_year(c * 86400) == 61",
        "0s",
        "0s",
    ),
    (
        "PTrig",
        "sin(g) > 0.95 or cos(g) < -0.99 or tan(g) > 5 or atan(g) > 1.48 or tanh(g - 5) < -0.999"
        " or asin(g / 12) > 1.2 or acos(g / 12) < 0.3 or sinh(g) > 1e5 or cosh(g - 9) > 50",
        "0s",
        "0s",
    ),
    (
        "PTrig2",
        "asinh(g) > 3.1 or acosh(g) > 3.15 or atanh(g / 13) > 1.4 or deg(g) > 700"
        " or rad(g) > 0.2 and sgn(g - 7) == -1 or (g atan2 c) > 1.5",
        "0s",
        "0s",
    ),
    # Over g: its per-series offsets keep values from tying (counters tie, and
    # Prometheus breaks ties in storage order).
    ("POrdered", "topk by (job) (2, g) > 6 or sort_desc(bottomk(1, g)) < 2", "0s", "0s"),
    ("PSort", "sort(g) > 10 or sort_desc(c) < 1", "0s", "0s"),
]

JOBS = ("a", "b")
INSTS = ("i1", "i2", "i3")


def rules_doc(table: list[tuple[str, str, str, str]] = RULES) -> dict[str, Any]:
    rules = []
    for name, expr, for_, keep in table:
        rules.append(
            {
                "alert": name,
                "expr": expr,
                "for": for_,
                "keep_firing_for": keep,
                "labels": {"sev": "x"},
                # 12 digits: the order in which Prometheus averages series is
                # storage order, so the last bit of avg() may differ.
                "annotations": {"v": '{{ printf "%.12g" $value }}', "l": "{{ $labels.inst }}"},
            }
        )
    return {"groups": [{"name": "diff", "rules": rules}]}


def _fmt(v: float) -> str:
    return repr(v) if v == v else "NaN"


def _presence(rng: random.Random) -> list[bool]:
    """Which steps carry a sample: series start late, stop, or have gaps (some beyond 5m)."""
    on = [True] * SAMPLES
    kind = rng.random()
    if kind < 0.2:
        start = rng.randrange(SAMPLES // 2)
        for i in range(start):
            on[i] = False
    elif kind < 0.4:
        stop = rng.randrange(SAMPLES // 3, SAMPLES)
        for i in range(stop, SAMPLES):
            on[i] = False
    elif kind < 0.6:
        a = rng.randrange(SAMPLES)
        b = min(SAMPLES, a + rng.choice([2, 5, 11, 13]))  # > 10 steps: longer than 5m
        for i in range(a, b):
            on[i] = False
    return on


def _tokens(values: list[float | None], on: list[bool], rng: random.Random) -> str:
    out = []
    stale_done = False
    for i, v in enumerate(values):
        if not on[i]:
            if not stale_done and i > 0 and on[i - 1] and rng.random() < 0.5:
                out.append("stale")
                stale_done = True
            else:
                out.append("_")
            continue
        stale_done = False
        out.append("_" if v is None else _fmt(v))
    return " ".join(out)


def _gauge(rng: random.Random, offset: float) -> list[float | None]:
    """A gauge; ``offset`` (distinct per series) keeps values of two series from tying.

    Prometheus iterates series in storage order, which promtool's loader leaves
    unspecified, so ties (topk) and the order of an average must not matter.
    """
    v = rng.choice([0.0, 3.0, 5.0, 9.0]) + offset
    out: list[float | None] = []
    for _ in range(SAMPLES):
        r = rng.random()
        if r < 0.03:
            out.append(float("nan"))
            continue
        if r < 0.35:
            v = max(offset, min(12.0 + offset, v + rng.choice([-3, -1, -0.5, 0.25, 1, 2, 4])))
        out.append(v)
    return out


def _counter(rng: random.Random, rate: float) -> list[float | None]:
    v = float(rng.choice([0, 0, 5, 100]))
    out: list[float | None] = []
    for _ in range(SAMPLES):
        if rng.random() < 0.05:
            v = float(rng.choice([0, 1]))
        else:
            v += rng.choice([0, 0, 1, 2]) * rate
        out.append(v)
    return out


def make_case(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    series = []
    for ji, job in enumerate(JOBS):
        for ii, inst in enumerate(INSTS):
            if rng.random() < 0.2:
                continue
            lab = f'job="{job}",inst="{inst}"'
            series.append(
                {
                    "series": f"g{{{lab}}}",
                    "values": _tokens(_gauge(rng, (ji * 3 + ii) / 64), _presence(rng), rng),
                }
            )
            if rng.random() < 0.7:
                cv = _counter(rng, rng.choice([0.5, 1.0, 3.0]))
                series.append({"series": f"c{{{lab}}}", "values": _tokens(cv, _presence(rng), rng)})
        if rng.random() < 0.8:
            on = _presence(rng)
            counts = [0.0, 0.0, 0.0, 0.0]
            cols: list[list[float | None]] = [[], [], [], []]
            weights = [rng.random() for _ in range(3)]
            for _ in range(SAMPLES):
                if rng.random() < 0.04:
                    counts = [0.0] * 4
                n = rng.choice([0, 1, 3, 6])
                for _k in range(n):
                    r = rng.random() * sum(weights)
                    b = 0 if r < weights[0] else 1 if r < weights[0] + weights[1] else 2
                    for j in range(b, 4):
                        counts[j] += 1
                for j in range(4):
                    cols[j].append(counts[j])
            for le, col in zip(("0.1", "0.5", "1", "+Inf"), cols, strict=True):
                series.append(
                    {
                        "series": f'h_bucket{{job="{job}",inst="x",le="{le}"}}',
                        "values": _tokens(col, on, random.Random(seed * 7 + len(le))),
                    }
                )
    return {"name": f"case {seed}", "interval": f"{INTERVAL_S}s", "input_series": series}


def kcops_expectations(
    ruleset: Any, case: dict[str, Any], table: list[tuple[str, str, str, str]] = RULES
) -> list[dict[str, Any]]:
    group = PromtoolGroup(
        case["name"],
        float(INTERVAL_S),
        [(series_key(s["series"]), expand_values(s["values"])) for s in case["input_series"]],
        [],
    )
    engine = RuleEngine(ruleset, build_store(group), default_step_s=float(EVAL_S))
    tests = []
    for step in range(STEPS + 1):
        ts = step * EVAL_S
        engine.evaluate(ts)
        errors = {n: h.error for n, h in engine.health.items() if h.error}
        assert not errors, f"{case['name']} t={ts}: kcops evaluation errors {errors}"
        for name, *_ in table:
            exp = []
            for inst in engine.states[name].values():
                if inst.state != "firing":
                    continue
                labels = {k: v for k, v in inst.labels if k != "alertname"}
                exp.append({"exp_labels": labels, "exp_annotations": dict(inst.annotations)})
            tests.append({"eval_time": f"{ts}s", "alertname": name, "exp_alerts": exp})
    return tests


BATCH = 100  # cases per promtool run


def _promtool(tmp_path: Path, n: int, groups: list[dict[str, Any]]) -> subprocess.Popen[bytes]:
    doc = {"rule_files": ["rules.yaml"], "evaluation_interval": f"{EVAL_S}s", "tests": groups}
    test_file = tmp_path / f"diff{n}.yaml"
    # JSON is YAML, and far faster to write than PyYAML's pure-Python emitter.
    test_file.write_text(json.dumps(doc))
    with open(tmp_path / f"diff{n}.log", "wb") as log:  # a file: a pipe could fill and block it
        return subprocess.Popen(
            ["promtool", "test", "rules", test_file.name],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
        )


def run_differential(tmp_path: Path, table: list[tuple[str, str, str, str]], seeds: range) -> None:
    """kcops's expectations for ``seeds``, judged by promtool in batches of many cases.

    promtool checks one batch while kcops computes the next, so the two
    overlap; each promtool run pays its start-up once for ``BATCH`` cases.
    """
    ruleset = load_rules_data(rules_doc(table), "differential")
    (tmp_path / "rules.yaml").write_text(export_rules(ruleset))
    fired: set[str] = set()
    runs: list[subprocess.Popen[bytes]] = []
    groups: list[dict[str, Any]] = []
    for i, seed in enumerate(seeds):
        case = make_case(seed)
        case["alert_rule_test"] = kcops_expectations(ruleset, case, table)
        fired |= {t["alertname"] for t in case["alert_rule_test"] if t["exp_alerts"]}
        groups.append(case)
        if len(groups) == BATCH or i == len(seeds) - 1:
            runs.append(_promtool(tmp_path, len(runs), groups))
            groups = []
    # Every rule must fire somewhere, or the comparison proves little for it.
    assert fired == {name for name, *_ in table}, sorted({n for n, *_ in table} - fired)
    failed = []
    for n, proc in enumerate(runs):
        if proc.wait(timeout=1500) != 0:
            failed.append((tmp_path / f"diff{n}.log").read_text()[-6000:])
    assert not failed, f"{len(failed)} of {len(runs)} promtool runs failed:\n" + failed[0]


@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_kcops_timeline_equals_promtool(tmp_path: Path) -> None:
    run_differential(tmp_path, RULES, range(CASES))


@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_new_functions_subqueries_and_re2_equal_promtool(tmp_path: Path) -> None:
    """Issue 17's features (subqueries, predict_linear, label_replace, RE2-only regex
    forms, ordered aggregations, ...) over 200 seeds of their own (CASES..)."""
    run_differential(tmp_path, RULES_PROMQL, range(CASES, CASES + PROMQL_CASES))
