"""Ladders from rule files, and the packaged alert table against the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcops.agent.actions.registry import default_registry
from kcops.agent.actions.rulesfile import RuleLadders, parse_duration_s


def test_durations() -> None:
    assert parse_duration_s("1m30s", 0) == 90
    assert parse_duration_s("500ms", 0) == 0.5
    assert parse_duration_s(None, 60) == 60
    assert parse_duration_s(5, 0) == 5
    for bad in ("1x", "m", "", "1m 2s"):
        with pytest.raises(ValueError):
            parse_duration_s(bad, 0)


def test_packaged_rules_ladders_are_valid() -> None:
    """Every step of alerts/rules.yaml names a registered action with valid params."""
    ladders = RuleLadders(None, 60.0)
    names = ladders.names()
    if not names:
        pytest.skip("alerts/rules.yaml not present")
    reg = default_registry()
    seen = 0
    for name in names:
        for step in ladders.ladder(name):
            reg.get(step.action).parse(step.params)
            assert step.verify_s > 0
            seen += 1
    assert seen > 0


def test_rule_file_reloads_when_changed(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        "groups: [{name: g, rules: [{alert: A, expr: x, remediation: [{action: notify}]}]}]"
    )
    lad = RuleLadders(f, 30.0)
    assert [s.action for s in lad.ladder("A")] == ["notify"]
    assert lad.ladder("A")[0].verify_s == 30.0
    import os

    f.write_text(
        "groups: [{name: g, rules: [{alert: A, expr: x, remediation: "
        "[{action: scale_out, verify: 2m}]}]}]"
    )
    os.utime(f, (1, 1))
    assert [(s.action, s.verify_s) for s in lad.ladder("A")] == [("scale_out", 120.0)]
