"""promtool test files: expanding notation, series parsing, replay and --assert semantics."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kcops.agent.promql.model import RuleError
from kcops.agent.rules.loader import load_rules_data
from kcops.agent.rules.promtest import expand_values, load_test_file, replay_group, series_key
from kcops.agent.samples import SeriesKey, is_stale


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("1+2x3", [1, 3, 5, 7]),
        ("5-1x2", [5, 4, 3]),
        ("-1+1x1", [-1, 0]),
        ("7x2", [7, 7, 7]),
        ("1 _ 3", [1, None, 3]),
        ("_x3 1", [None, None, None, 1]),
        ("1e-1x1", [0.1, 0.1]),
    ],
)
def test_expanding_notation(text: str, want: list[float | None]) -> None:
    assert expand_values(text) == want


def test_special_values() -> None:
    got = expand_values("stale NaN Inf -Inf")
    assert got[0] is not None and is_stale(got[0])
    assert got[1] is not None and math.isnan(got[1]) and not is_stale(got[1])
    assert got[2:] == [math.inf, -math.inf]
    with pytest.raises(RuleError, match="bad series value"):
        expand_values("1 two")


def test_series_key() -> None:
    assert series_key('up{job="a", instance="x"}') == SeriesKey.of(
        "up", {"job": "a", "instance": "x"}
    )
    assert series_key('{__name__="up"}') == SeriesKey.of("up")


RULES = {
    "groups": [
        {
            "name": "g",
            "rules": [
                {
                    "alert": "Down",
                    "expr": "up == 0",
                    "for": "1m",
                    "annotations": {"v": "{{ $value }}"},
                }
            ],
        }
    ]
}


def test_assert_compares_with_the_last_evaluation_at_or_before_eval_time(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(
        """
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'up{job="a"}'
        values: '1 0 0 0 1'
    alert_rule_test:
      - {eval_time: 1m59s, alertname: Down, exp_alerts: []}
      - eval_time: 2m59s
        alertname: Down
        exp_alerts: [{exp_labels: {job: a}, exp_annotations: {v: "0"}}]
      - {eval_time: 4m, alertname: Down, exp_alerts: [{exp_labels: {job: b}}]}
"""
    )
    test = load_test_file(f)
    ruleset = load_rules_data(RULES)
    out = list(replay_group(ruleset, test.groups[0], test.evaluation_interval_s))
    transitions = [(tr.t, tr.state) for tr, _ in out if tr is not None]
    failures = [f for _, f in out if f is not None]
    assert transitions == [(60.0, "pending"), (120.0, "firing"), (240.0, "inactive")]
    assert len(failures) == 1 and "time: 240s" in failures[0] and "job': 'b'" in failures[0]


def test_test_files_are_read_by_the_bounded_loader(tmp_path: Path) -> None:
    p = tmp_path / "t.yaml"
    p.write_text("rule_files: [r.yaml]\ntests:\n- interval: &i 1m\n  input_series: []\n  x: *i\n")
    with pytest.raises(RuleError, match="line 3, column 13: anchors and aliases are not allowed"):
        load_test_file(p)
    p.write_text("evaluation_interval: 2001-13-45\n")
    with pytest.raises(RuleError, match="not a valid !!timestamp"):
        load_test_file(p)


def test_a_subquery_without_a_step_steps_at_the_files_evaluation_interval(tmp_path: Path) -> None:
    # promtool 2.42 steps x[5m:] at the test file's evaluation_interval: 30s
    # gives 11 points at 10m (checked with promtool; the agent's default is 1m).
    f = tmp_path / "t.yaml"
    f.write_text(
        """
evaluation_interval: 30s
tests:
  - interval: 15s
    input_series:
      - {series: 'x', values: '1x100'}
    alert_rule_test:
      - eval_time: 10m
        alertname: Points
        exp_alerts: [{exp_labels: {}, exp_annotations: {n: "11"}}]
"""
    )
    doc = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "Points",
                        "expr": "count_over_time(x[5m:]) > 0",
                        "annotations": {"n": "{{ $value }}"},
                    }
                ],
            }
        ]
    }
    test = load_test_file(f)
    out = list(replay_group(load_rules_data(doc), test.groups[0], test.evaluation_interval_s))
    assert [f for _, f in out if f is not None] == []
