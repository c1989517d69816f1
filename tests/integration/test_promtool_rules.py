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
    assert "SUCCESS: 14 rules found" in proc.stdout


@needs_promtool
def test_packaged_tests_pass_under_promtool(tmp_path: Path) -> None:
    _export(tmp_path)
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
