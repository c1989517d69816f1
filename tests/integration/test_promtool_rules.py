"""The packaged alert table under the real promtool and under `kcops alerts replay --assert`.

Each file in alerts/tests/ is run twice: by ``promtool test rules`` against
the exported rule file, and by kcops's replay against alerts/rules.yaml. Both
must pass, so the agent and a Prometheus evaluating the export agree.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from kcops.alerts import packaged_file, packaged_tests
from kcops.cli.alerts import alerts_group

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="no promtool")
TESTS = packaged_tests()


def _export(tmp_path: Path, *args: str) -> Path:
    result = CliRunner().invoke(alerts_group, ["export", *args])
    assert result.exit_code == 0, result.output
    out = tmp_path / "rules.yaml"
    out.write_text(result.output)
    return out


def test_every_alert_has_a_test_file() -> None:
    import yaml

    rules = yaml.safe_load(packaged_file("rules.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tested = set()
    for f in TESTS:
        doc = yaml.safe_load(f.read_text())
        for t in doc["tests"]:
            tested |= {a["alertname"] for a in t.get("alert_rule_test", []) if a.get("exp_alerts")}
    assert alerts <= tested, f"alerts without a firing test: {sorted(alerts - tested)}"


@needs_promtool
@pytest.mark.parametrize("fmt", ["prometheus", "prometheus-operator"])
def test_export_passes_promtool_check(tmp_path: Path, fmt: str) -> None:
    path = _export(tmp_path, "--format", fmt)
    if fmt == "prometheus-operator":
        import yaml

        doc = yaml.safe_load(path.read_text())
        assert doc["kind"] == "PrometheusRule"
        path.write_text(yaml.safe_dump(doc["spec"]))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 23 rules found" in proc.stdout  # 16 alerts, 7 fleet records


@needs_promtool
def test_packaged_tests_pass_under_promtool(tmp_path: Path) -> None:
    _export(tmp_path)
    shutil.copy(packaged_file("records.yaml"), tmp_path / "records.yaml")
    (tmp_path / "tests").mkdir()
    for f in TESTS:
        shutil.copy(f, tmp_path / "tests" / f.name)
    proc = subprocess.run(
        ["promtool", "test", "rules", *[f.name for f in TESTS]],
        capture_output=True,
        text=True,
        cwd=tmp_path / "tests",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("test_file", TESTS, ids=[f.stem for f in TESTS])
def test_packaged_tests_pass_under_kcops_replay(test_file: Path) -> None:
    result = CliRunner().invoke(alerts_group, ["replay", "--assert", str(test_file)])
    assert result.exit_code == 0, result.output


@needs_promtool
def test_a_wrong_expectation_fails_both(tmp_path: Path) -> None:
    """The two runners are not vacuous: shift one expected firing time and both fail."""
    text = (packaged_file("tests/device_memory.yaml")).read_text()
    bad = text.replace("eval_time: 3m\n", "eval_time: 2m45s\n", 1)
    assert bad != text
    _export(tmp_path)
    shutil.copy(packaged_file("records.yaml"), tmp_path / "records.yaml")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "bad.yaml").write_text(bad)
    proc = subprocess.run(
        ["promtool", "test", "rules", "bad.yaml"],
        capture_output=True,
        text=True,
        cwd=tmp_path / "tests",
    )
    assert proc.returncode != 0
    local = tmp_path / "local.yaml"
    local.write_text(bad.replace("- ../rules.yaml", f"- {packaged_file('rules.yaml')}"))
    result = CliRunner().invoke(alerts_group, ["replay", "--assert", str(local)])
    assert result.exit_code == 1
    assert "KcopsDeviceMemoryHigh" in result.output


GROUPS_RULES = {
    "groups": [
        {
            # promtool (and kcops's replay, as promtool) evaluates every group at every
            # evaluation_interval step, whatever its interval; the agent honours it.
            "name": "every-30s",
            "interval": "30s",
            "rules": [{"alert": "Any", "expr": "x > 0", "for": "1m"}],
        },
        {
            "name": "limited",
            "limit": 2,
            "rules": [
                {"record": "r:x", "expr": "x * 2"},
                {"alert": "TwoAtMost", "expr": "x > 0", "labels": {"severity": "page"}},
            ],
        },
    ]
}


def _groups_case(tmp_path: Path, n_series: int) -> Path:
    import yaml

    from kcops.agent.rules.export import export_rules
    from kcops.agent.rules.loader import load_rules_data

    rules = tmp_path / "rules.yaml"
    rules.write_text(export_rules(load_rules_data(GROUPS_RULES, "groups.yaml")))
    series = [{"series": f'x{{i="{i}"}}', "values": "1x10"} for i in range(n_series)]
    expected = [{"exp_labels": {"i": str(i), "severity": "page"}} for i in range(n_series)]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "30s",
        "tests": [
            {
                "interval": "30s",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": "30s", "alertname": "Any", "exp_alerts": []},
                    {
                        "eval_time": "1m",
                        "alertname": "Any",
                        "exp_alerts": [{"exp_labels": {"i": str(i)}} for i in range(n_series)],
                    },
                    {"eval_time": "1m", "alertname": "TwoAtMost", "exp_alerts": expected},
                ],
            }
        ],
    }
    path = tmp_path / "groups_test.yaml"
    path.write_text(yaml.safe_dump(test))
    return path


@needs_promtool
@pytest.mark.parametrize(
    ("n_series", "error"), [(2, None), (3, "exceeded limit of 2 with 3 alerts")]
)
def test_group_interval_and_limit_judged_by_promtool(
    tmp_path: Path, n_series: int, error: str | None
) -> None:
    """A group's ``limit`` under promtool and under replay: within it both pass; one series
    over it, both fail the rule's evaluation with Prometheus's message."""
    test = _groups_case(tmp_path, n_series)
    assert "limit: 2" in (tmp_path / "rules.yaml").read_text()  # the export keeps it
    proc = subprocess.run(
        ["promtool", "test", "rules", test.name], capture_output=True, text=True, cwd=tmp_path
    )
    result = CliRunner().invoke(alerts_group, ["replay", "--assert", str(test)])
    if error is None:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert result.exit_code == 0, result.output
        return
    assert proc.returncode != 0 and error in proc.stdout + proc.stderr
    assert result.exit_code == 1 and error in result.output
    assert "rule: TwoAtMost" in proc.stdout + proc.stderr and "rule: TwoAtMost" in result.output
