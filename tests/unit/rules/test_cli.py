"""``kcops alerts``: list, show, export, check, replay (exit codes:
docs/architecture.md#interfaces-and-conventions)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from kcops.alerts import packaged_file
from kcops.cli import alerts as alerts_cli
from kcops.cli.alerts import alerts_group


def invoke(*args: str) -> Any:
    return CliRunner().invoke(alerts_group, list(args))


def test_export_strips_kcops_keys_and_substitutes_params() -> None:
    res = invoke("export", "--param", "p99_ttft_seconds=0.3")
    assert res.exit_code == 0, res.output
    doc = yaml.safe_load(res.output)
    assert "params" not in doc
    rules = doc["groups"][0]["rules"]
    assert all("remediation" not in r and "${" not in r["expr"] for r in rules)
    p99 = next(r for r in rules if r["alert"] == "KcopsP99LatencyHigh")
    assert ") > 0.3\n" in p99["expr"]  # the param substituted into the threshold


def test_export_prometheus_operator() -> None:
    res = invoke("export", "--format", "prometheus-operator", "--namespace", "serving")
    doc = yaml.safe_load(res.output)
    assert doc["kind"] == "PrometheusRule" and doc["metadata"]["namespace"] == "serving"
    assert len(doc["spec"]["groups"][0]["rules"]) == 16


def test_check_good_and_bad(tmp_path: Path) -> None:
    assert invoke("check", str(packaged_file("rules.yaml"))).exit_code == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "groups: [{name: g, rules: [{alert: Slow, expr: 'holt_winters(x[5m], 0.1, 0.1)'}]}]"
    )
    res = invoke("check", str(bad))
    assert res.exit_code == 2
    assert "rule 'Slow'" in res.output and "holt_winters" in res.output


def test_show_and_list_file() -> None:
    res = invoke("show", "KcopsDeviceMemoryHigh")
    assert res.exit_code == 0
    doc = yaml.safe_load(res.output)
    assert doc["for"] == "1m" and doc["remediation"][1]["params"] == {
        "policy": "lru",
        "fraction": 0.5,
    }
    assert invoke("show", "Nope").exit_code == 1
    res = invoke("list", "--file", str(packaged_file("rules.yaml")))
    assert res.exit_code == 0 and res.output.count("\n") == 16
    guarded = {ln.split()[0] for ln in res.output.splitlines() if "warms up" in ln}
    assert guarded == {
        "KcopsP99LatencyHigh", "KcopsInterTokenLatencyHigh", "KcopsDeviceMemoryFullSoon",
        "KcopsPrefixCacheHitRateLow", "KcopsLatencyFluctuation",
    }  # fmt: skip


def test_list_from_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = {
        "alerts": [
            {
                "alertname": "KcopsEngineDown",
                "labels": {"alertname": "KcopsEngineDown", "engine": "e1"},
                "state": "firing",
                "active_since": 1.0,
            }
        ]
    }
    monkeypatch.setattr(alerts_cli, "agent_get_json", lambda url, path: payload)
    res = invoke("list")
    assert res.exit_code == 0 and "KcopsEngineDown" in res.output and "engine=e1" in res.output


def test_list_unreachable_agent_exits_3() -> None:
    res = invoke("list", "--agent", "http://127.0.0.1:9")
    assert res.exit_code == 3


def test_replay_prints_transitions_as_json_lines() -> None:
    res = invoke("replay", str(packaged_file("tests/device_memory.yaml")))
    assert res.exit_code == 0, res.output
    lines = [json.loads(x) for x in res.output.splitlines() if x.startswith("{")]
    mem = [(x["t"], x["state"]) for x in lines if x["alertname"] == "KcopsDeviceMemoryHigh"]
    assert mem == [(120, "pending"), (180, "firing"), (360, "inactive")]
    assert lines[-1]["labels"]["device"] == "0"


def test_param_flags_are_one_parser_through_the_bounded_yaml_loader() -> None:
    from kcops.cli.actions import parse_params as actions_params
    from kcops.cli.common import parse_params
    from kcops.errors import ConfigError

    assert actions_params is parse_params  # `actions run` and `alerts`/`dashboards` share it
    assert parse_params(("a=0.25", "b=false", "c=5m", "d=", " e =x")) == {
        "a": 0.25,
        "b": False,
        "c": "5m",
        "d": "",
        "e": "x",
    }
    for bad, needle in (("novalue", "expected NAME=VALUE"), ("x=&a 1", "anchors and aliases")):
        with pytest.raises(ConfigError, match=needle):
            parse_params((bad,))
    # Through the CLI: exit 2, one line.
    for args in (("--param", "p99_ttft_seconds=2001-13-45"), ("--param", "p99_ttft_seconds=.nan")):
        res = invoke("check", str(packaged_file("rules.yaml")), *args)
        assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
