"""Alertmanager's copies of the rule file's inhibit_rules (the agent applies the rule
file's; a cluster's Alertmanager applies these) say the same thing."""

from __future__ import annotations

from pathlib import Path

import yaml

from kcops.agent.rules.inhibit import Matcher
from kcops.alerts import packaged_file

REPO = Path(__file__).resolve().parents[3]


def _rules() -> list[dict[str, list[str]]]:
    return list(yaml.safe_load(packaged_file("rules.yaml").read_text())["inhibit_rules"])


def _triples(matchers: list[str]) -> list[tuple[str, str, str]]:
    return [(m.name, m.op, m.value) for m in map(Matcher.parse, matchers)]


def test_the_alertmanager_file_has_the_rule_files_inhibit_rules() -> None:
    doc = yaml.safe_load((REPO / "deploy" / "alertmanager" / "kcops-receiver.yml").read_text())
    assert doc["inhibit_rules"] == _rules()


def test_the_alertmanagerconfig_has_the_rule_files_inhibit_rules() -> None:
    doc = yaml.safe_load((REPO / "deploy" / "base" / "alertmanagerconfig.yaml").read_text())
    got = [
        {
            "source": [(m["name"], m["matchType"], m["value"]) for m in r["sourceMatch"]],
            "target": [(m["name"], m["matchType"], m["value"]) for m in r["targetMatch"]],
            "equal": r.get("equal", []),
        }
        for r in doc["spec"]["inhibitRules"]
    ]
    want = [
        {
            "source": _triples(r["source_matchers"]),
            "target": _triples(r["target_matchers"]),
            "equal": r.get("equal", []),
        }
        for r in _rules()
    ]
    assert got == want
