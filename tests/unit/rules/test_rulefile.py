"""The rule file's strict models: hostile values refused in one short line, action names and
step params taken from the action registry, the default verify window from config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kcops.agent.actions.registry import builtin_actions
from kcops.agent.config import parse_config
from kcops.agent.outcome import ActionName
from kcops.agent.promql.exprguard import MAX_EXPR_DEPTH
from kcops.agent.promql.model import RuleError
from kcops.agent.rules.loader import (
    default_rules_path,
    load_rules,
    load_rules_data,
    ruleset_from_config,
)
from kcops.cli import cli

# The ladder actions, as the agent and the CLI hand them to the loader.
ACTIONS = builtin_actions().ladder_params()


def doc(**rule: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"alert": "Bad", "expr": "up == 0"}
    base.update(rule)
    return {"groups": [{"name": "g", "rules": [base]}]}


HUGE = "x" * 200_000
HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    (
        "list as alert",
        {"groups": [{"name": "g", "rules": [{"alert": list(range(50_000)), "expr": "up"}]}]},
        "rule 0: alert: must be a string; got <list of 50000 items>",
    ),
    (
        "list as action",
        doc(remediation=[{"action": [1, 2]}]),
        "rule 'Bad': remediation[0].action: must be a string",
    ),
    (
        "dict as param",
        {"params": {"x": {"a": 1}}, **doc(expr="up > ${x}")},
        "params.x: a parameter must be a number or a string",
    ),
    (
        "nan param",
        {"params": {"x": float("nan")}, **doc()},
        "params.x: a parameter must be a finite",
    ),
    (
        "inf param",
        {"params": {"x": float("inf")}, **doc()},
        "params.x: a parameter must be a finite",
    ),
    ("bool param", {"params": {"x": True}, **doc()}, "params.x: a parameter must be a number or"),
    (
        "list label",
        doc(labels={"severity": [1, 2]}),
        "rule 'Bad': labels.severity: must be a string",
    ),
    ("bad label name", doc(labels={"a b": "x"}), "labels key 'a b': invalid label name"),
    ("label name with a digit first", doc(labels={"1x": "x"}), "invalid label name '1x'"),
    ("label name ending in a newline", doc(labels={"a\n": "x"}), "invalid label name 'a\\n'"),
    ("long label value", doc(labels={"a": "v" * 3000}), "labels.a: at most 2048 characters"),
    (
        "too many labels",
        doc(labels={f"l{i}": "v" for i in range(65)}),
        "labels: Dictionary should have at most 64",
    ),
    ("huge key", doc(**{HUGE: 1}), "unknown key; allowed keys: alert,"),
    ("huge action", doc(remediation=[{"action": HUGE}]), "unknown action 'xxxx"),
    ("huge param ref", doc(expr="up > ${" + HUGE + "}"), "unknown parameter ${xxx"),
    ("293y", doc(**{"for": "293y"}), "rule 'Bad': for: duration out of range"),
    (
        "step param lax bool",
        doc(remediation=[{"action": "evict_cache", "params": {"drop_running": "yes"}}]),
        "params: evict_cache: drop_running: Input should be a valid boolean; got 'yes'",
    ),
    (
        "step param unknown",
        doc(remediation=[{"action": "notify", "params": {"nope": 1}}]),
        "remediation[0].params: notify: nope: Extra inputs are not permitted",
    ),
    (
        "step param nan",
        doc(remediation=[{"action": "evict_cache", "params": {"fraction": float("nan")}}]),
        "evict_cache: fraction: must be a finite number",
    ),
    (
        "step params not a mapping",
        doc(remediation=[{"action": "notify", "params": [1]}]),
        "remediation[0].params: must be a mapping",
    ),
    (
        "not a ladder action",
        doc(remediation=[{"action": "restore_route"}]),
        "unknown action 'restore_route'",
    ),
    (
        "too many steps",
        doc(remediation=[{"action": "notify"}] * 33),
        "remediation: List should have at most 32",
    ),
    ("deep parens", doc(expr="(" * 3000 + "1" + ")" * 3000), "expr: expression too complex"),
    ("long sum", doc(expr="+".join(["1"] * 5000)), "expr: expression too complex"),
    (
        "deep template",
        doc(annotations={"d": "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}"}),
        "annotations.d: template error",
    ),
    (
        "bad record name",
        {"groups": [{"name": "g", "rules": [{"record": "a-b", "expr": "up"}]}]},
        "record: invalid recording rule name 'a-b'",
    ),
    (
        "for on a record",
        {"groups": [{"name": "g", "rules": [{"record": "a", "expr": "up", "for": "1m"}]}]},
        "rule 'a': 'for' is only valid on alerting rules",
    ),
    ("bool expr", doc(expr=True), "expr: 'expr' is required"),
    (
        "group limit huge",
        {"groups": [{"name": "g", "limit": 2**70, "rules": []}]},
        "group 'g': limit: Input should be less than or equal to",
    ),
    ("groups a mapping", {"groups": {"a": 1}}, "groups: must be a list"),
    (
        "rule a number",
        {"groups": [{"name": "g", "rules": [1]}]},
        "group 'g': rule 0: must be a mapping",
    ),
]


@pytest.mark.parametrize(
    ("data", "needle"), [(d, n) for _, d, n in HOSTILE], ids=[h[0] for h in HOSTILE]
)
def test_hostile_values_are_refused_in_one_short_line(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(RuleError) as exc:
        load_rules_data(data, "f.yaml", actions=ACTIONS)
    msg = str(exc.value)
    assert msg.startswith("f.yaml: ") and needle in msg, msg
    assert "\n" not in msg and len(msg) < 400, msg


def test_every_problem_is_counted_but_one_is_shown() -> None:
    with pytest.raises(RuleError) as exc:
        load_rules_data(doc(labels={"a": [1]}, annotations={"b": [2]}), "f.yaml")
    assert str(exc.value).endswith("(and 1 more problem)")


def test_alerts_check_exits_2_with_one_line(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(doc(remediation=[{"action": HUGE}])))
    res = CliRunner().invoke(cli, ["alerts", "check", str(p)])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and len(res.output) < 400, res.output


def test_prometheus_scalars_are_read_as_prometheus_reads_them() -> None:
    a = load_rules_data(doc(expr=5, labels={"prio": 1, "empty": None}, **{"for": 0})).alerts()[0]
    assert a.expr == "5" and a.for_s == 0.0
    assert a.raw["labels"] == {"prio": "1", "empty": ""}


def test_bounds_are_those_of_prometheus_and_kcops() -> None:
    ok = doc(expr=" + ".join(["up"] * (MAX_EXPR_DEPTH // 2)), **{"for": "292y"})
    assert load_rules_data(ok).alerts()[0].for_s == pytest.approx(292 * 365 * 86400)


def test_ladder_actions_are_the_registry_s() -> None:
    reg = builtin_actions()
    ladder = list(ACTIONS)
    # Everything registered may be a step, except what kcops runs by itself.
    # (evict_pod: the supervisor's escalation after a crash loop)
    assert set(reg.names()) - set(ladder) == {"restore_route", "evict_pod"}
    # The loader accepts each ladder action the registry has, and nothing else.
    steps = [{"action": name} for name in ladder]
    loaded = load_rules_data(doc(remediation=steps), actions=ACTIONS).alerts()[0].remediation
    assert [s.action for s in loaded] == ladder
    with pytest.raises(RuleError, match="allowed: " + ", ".join(ladder)):
        load_rules_data(doc(remediation=[{"action": "reboot"}]), actions=ACTIONS)
    # The packaged ladders name only registered actions and pass their params models.
    for a in load_rules(default_rules_path(), actions=ACTIONS).alerts():
        for step in a.remediation:
            reg.get(step.action).params.model_validate(dict(step.params), strict=True)


def test_without_the_actions_a_step_is_checked_against_the_action_names() -> None:
    """A loader handed no actions (``kcops dashboards``, ``kcops alerts check``) checks the
    names against every action kcops has (its ``ActionName``), not their parameters, and
    refuses a step that is not a step."""
    loaded = load_rules_data(doc(remediation=[{"action": "notify"}])).alerts()[0].remediation
    assert [s.action for s in loaded] == [ActionName.NOTIFY]
    with pytest.raises(RuleError, match=r"unknown action 'reboot'; allowed: evict_cache"):
        load_rules_data(doc(remediation=[{"action": "reboot"}]))
    with pytest.raises(RuleError, match=r"remediation\[0\]\.action: must be a string"):
        load_rules_data(doc(remediation=[{"action": [1]}]))


def test_a_step_without_verify_takes_the_configured_default(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text(
        yaml.safe_dump(
            doc(remediation=[{"action": "notify"}, {"action": "notify", "verify": "5m"}])
        )
    )
    cfg = parse_config(
        {"rules": {"file": str(p)}, "actions": {"guards": {"default_verify_s": "2m"}}}
    )
    steps = ruleset_from_config(cfg).alerts()[0].remediation
    assert [s.verify_s for s in steps] == [120.0, 300.0]
    # No config: the one default (60 s), as the config's own default.
    default = load_rules_data(doc(remediation=[{"action": "notify"}])).alerts()[0].remediation
    assert default[0].verify_s == parse_config({}).actions.guards.default_verify_s == 60.0


def test_overrides_are_checked_like_the_file_s_params() -> None:
    data = {"params": {"t": 0.5}, **doc(expr="up > ${t}")}
    assert load_rules_data(data, overrides={"t": 2}).alerts()[0].expr == "up > 2"
    for bad, needle in (
        (float("nan"), "finite"),
        ({"a": 1}, "number or a string"),
        (True, "number"),
    ):
        with pytest.raises(RuleError, match=f"rules.params.t: .*{needle}"):
            load_rules_data(data, "f.yaml", overrides={"t": bad})


@pytest.mark.parametrize(
    "expr", ["rate(x[1e999])", "x offset 1e300", "x[5m:1e12]", "rate(x[0xffffffffffffffffffff])"]
)
def test_numeric_durations_past_the_range_are_refused_before_the_parser(expr: str) -> None:
    # promql-parser panics (a Rust panic, printed to stderr) on these; never reach it.
    with pytest.raises(
        RuleError, match=r"rule 'Bad': expr: duration out of range: .* \(at most 292y\)"
    ):
        load_rules_data(doc(expr=expr), "f.yaml")
    for fine in ("rate(x[300])", "job:1e99 > 0", 'x{a="[1e999]"}', "x > 1e300"):
        assert load_rules_data(doc(expr=fine)).alerts()[0].expr == fine
