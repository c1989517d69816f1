"""Rule files: params, remediation ladders, and malformed files refused with name and reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcops.agent.actions.registry import builtin_actions
from kcops.agent.promql.model import RuleError
from kcops.agent.rules.loader import load_rules, load_rules_data, parse_duration


def doc(**rule: object) -> dict:  # type: ignore[type-arg]
    base: dict[str, object] = {"alert": "Bad", "expr": "up == 0"}
    base.update(rule)
    return {"groups": [{"name": "g", "rules": [base]}]}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (doc(expr="nosuchfn(up)"), "rule 'Bad': expr: cannot parse expression: unknown function"),
        (doc(expr="mad_over_time(up[5m])"), "rule 'Bad': expr: function 'mad_over_time'"),
        # Regexes RE2 (Prometheus's syntax) refuses: the rule, the reason, the position.
        (
            doc(expr='up{job=~"ab(?=c)"}'),
            "rule 'Bad': expr: invalid regex 'ab(?=c)': invalid perl operator: (?= at offset 2",
        ),
        (doc(expr='up{job!~"x{1001}"}'), "invalid repetition size: {1001} at offset 1"),
        (doc(expr='up{job=~"a\\\\C"}'), "invalid escape sequence: \\C at offset 1"),
        (
            doc(expr='label_replace(up, "a", "$1", "b", "(x")'),
            "rule 'Bad': expr: invalid regex '(x': missing ): (x at offset 0",
        ),
        (doc(expr="sum(up"), "rule 'Bad': expr: cannot parse"),
        (doc(**{"for": "5x"}), "rule 'Bad': for: not a valid duration"),
        (doc(keep_firing_for="1.5m"), "rule 'Bad': keep_firing_for"),
        (
            doc(annotations={"d": "{{ $value | nope }}"}),
            "rule 'Bad': annotations.d: template error",
        ),
        (doc(annotations={"d": "{{ if $value }}x{{ end }}"}), "template action 'if'"),
        (doc(annotations={"d": "{{ $value "}), "unclosed action"),
        (doc(labels={"s": "{{ $nope }}"}), "rule 'Bad': labels.s: template error"),
        (doc(remediation=[{"action": "reboot_datacenter"}]), "unknown action 'reboot_datacenter'"),
        (doc(remediation=[{"action": "notify", "verify": "soon"}]), "remediation[0].verify: not a"),
        (doc(expr="up > ${nope}"), "unknown parameter ${nope}"),
        (doc(unknown_key=1), "'Bad': unknown_key: unknown key; allowed keys: alert,"),
        ({"groups": [{"name": "g", "rules": [{"expr": "up"}]}]}, "exactly one of 'alert'"),
        ({"grups": []}, "f.yaml: grups: unknown key; allowed keys: groups, inhibit_rules, params"),
    ],
)
def test_malformed_rules_are_refused_with_name_and_reason(data: dict, needle: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(RuleError) as exc:
        load_rules_data(data, "f.yaml", actions=builtin_actions().ladder_params())
    assert needle in str(exc.value)
    assert str(exc.value).startswith("f.yaml")


def test_bad_yaml_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "r.yaml"
    p.write_text("groups: [\n  - name: x\n    rules: {")
    with pytest.raises(RuleError, match="not valid YAML"):
        load_rules(p)


def test_params_are_substituted_and_overridable() -> None:
    data = {
        "params": {"t": 0.5, "w": "5m"},
        "groups": [
            {
                "name": "g",
                "rules": [
                    {
                        "alert": "A",
                        "expr": "rate(x[${w}]) > ${t}",
                        "for": "${w}",
                        "annotations": {"s": "above ${t}"},
                    }
                ],
            }
        ],
    }
    a = load_rules_data(data).alerts()[0]
    assert a.expr == "rate(x[5m]) > 0.5" and a.for_s == 300.0
    b = load_rules_data(data, overrides={"t": 0.25}).alerts()[0]
    assert b.expr == "rate(x[5m]) > 0.25" and b.annotations["s"].source == "above 0.25"
    with pytest.raises(RuleError, match=r"rules.params.nope: unknown parameter \(known: t, w\)"):
        load_rules_data(data, overrides={"nope": 1})


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("30s", 30.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_packaged_table_loads_with_ladders() -> None:
    from kcops.agent.rules.loader import default_rules_path

    rs = load_rules(default_rules_path())
    alerts = {a.name: a for a in rs.alerts()}
    assert len(alerts) == 16
    mem = alerts["KcopsDeviceMemoryHigh"]
    assert [(s.action, dict(s.params)) for s in mem.remediation] == [
        ("evict_cache", {"policy": "expired"}),
        ("evict_cache", {"policy": "lru", "fraction": 0.5}),
        ("fallback_to_base", {"hold_s": 600}),
    ]
    for a in alerts.values():
        assert a.raw["labels"]["severity"] in ("page", "ticket", "info")
        assert a.raw["annotations"]["runbook_url"].endswith(f"/{a.name}.md")
        assert a.remediation, a.name
    (inhibit,) = rs.inhibit_rules  # the agent's own restart inhibits what it causes
    assert [str(m.value) for m in inhibit.source] == ["KcopsEngineRestarting"]
    assert inhibit.target[0].matches({"alertname": "KcopsEngineDown"})
    assert not inhibit.target[0].matches({"alertname": "KcopsEngineStalled"})


def test_repeated_rule_name_is_refused_naming_it() -> None:
    data = {
        "groups": [
            {
                "name": "g",
                "rules": [
                    {"alert": "HighX", "expr": "x > 1", "labels": {"severity": "ticket"}},
                    {"alert": "HighX", "expr": "x > 100", "labels": {"severity": "page"}},
                ],
            }
        ]
    }
    with pytest.raises(RuleError, match=r"'HighX'.*unique"):
        load_rules_data(data)
