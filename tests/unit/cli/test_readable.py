"""Readable CLI output: local ISO times and "ago", never raw Unix seconds; --json everywhere."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from kcops.cli import cli
from kcops.cli.timefmt import ago, duration, local_iso, when
from tests.services import agent_in_thread
from tests.unit.cli.engine_like import EngineLike

UNIX_SECONDS = re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b")  # 2020..2033 as raw epoch seconds


def test_duration_and_ago() -> None:
    assert duration(42) == "42s"
    assert duration(185) == "3m05s"
    assert duration(3 * 60) == "3m"
    assert duration(2 * 3600 + 4 * 60) == "2h04m"
    assert duration(3 * 86400 + 7200) == "3d02h"
    assert ago(1000.0, now=1180.0) == "3m ago"
    assert ago(1180.0, now=1000.0) == "in 3m"
    assert ago(None) == "never" and when(None) == "never"


def test_local_iso_round_trips_with_its_offset() -> None:
    ts = 1_780_000_000.0
    text = local_iso(ts)
    assert datetime.fromisoformat(text).timestamp() == ts
    assert re.search(r"[+-]\d\d:\d\d$", text)


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    with agent_in_thread(tmp_path, min_ticks=3, extra_collectors=[EngineLike()]) as url:
        yield url


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["alerts", "list"],
        ["diagnose"],
        ["actions", "list"],
        ["actions", "history"],
        ["runbook", "KcopsDeviceMemoryHigh"],
    ],
)
def test_read_commands_print_no_epoch_seconds_and_offer_json(
    agent_url: str, args: list[str]
) -> None:
    res = CliRunner().invoke(cli, [*args, "--agent", agent_url])
    assert res.exit_code == 0, res.output
    assert not UNIX_SECONDS.search(res.output), res.output
    res = CliRunner().invoke(cli, [*args, "--agent", agent_url, "--json"])
    assert res.exit_code == 0, res.output
    if args != ["actions", "history"]:  # JSON lines, one per record (none here)
        json.loads(res.output)


def test_alerts_list_shows_since_as_local_time(agent_url: str) -> None:
    res = CliRunner().invoke(cli, ["alerts", "list", "--agent", agent_url])
    line = next(ln for ln in res.output.splitlines() if "KcopsDeviceMemoryHigh" in ln)
    assert "pending" in line and "ago)" in line and time.strftime("%Y-%m-%dT") in line


def test_alerts_show_and_runbook_offline_json() -> None:
    res = CliRunner().invoke(cli, ["alerts", "show", "KcopsEngineDown", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["alert"] == "KcopsEngineDown"
    res = CliRunner().invoke(cli, ["runbook", "KcopsEngineDown", "--offline", "--json"])
    doc = json.loads(res.output)
    assert doc["name"] == "KcopsEngineDown" and doc["live"] is None and "#" in doc["text"]


# Every command of the CLI is either a read command, which must offer --json, or
# one of these, which write or run something (the reason says what).
NOT_READ = {
    "actions run": "runs an action (its record has --json)",
    "agent run": "runs the agent",
    "alerts export": "writes a Prometheus rule file",
    "alerts replay": "prints JSON lines already",
    "dashboards build": "writes dashboard JSON files",
    "dashboards export": "writes ConfigMaps YAML",
    "dashboards push": "writes to Grafana",
    "demo": "runs the demo",
    "incident export": "writes a .tar.gz",
    "kc report": "writes plots and HTML",
    "report": "writes an HTML page",
    "serve": "runs the worker",
}


def _commands() -> dict[str, list[str]]:
    import click

    ctx = click.Context(cli)
    out: dict[str, list[str]] = {}

    def walk(cmd: click.Command, path: list[str]) -> None:
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])
        else:
            out[" ".join(path)] = [o for p in cmd.params for o in getattr(p, "opts", [])]

    walk(cli, [])
    return out


def test_every_read_command_offers_json() -> None:
    commands = _commands()
    assert set(NOT_READ) <= set(commands), set(NOT_READ) - set(commands)
    read = {name: opts for name, opts in commands.items() if name not in NOT_READ}
    assert {"top", "version", "alerts check", "agent check-config", "status"} <= set(read)
    missing = sorted(name for name, opts in read.items() if "--json" not in opts)
    assert missing == [], f"read commands without --json: {missing}"


def test_offline_read_commands_print_json(tmp_path: Path) -> None:
    from kcops import __version__
    from kcops.alerts import packaged_file

    res = CliRunner().invoke(cli, ["version", "--json"])
    assert json.loads(res.output)["version"] == __version__
    res = CliRunner().invoke(cli, ["alerts", "check", str(packaged_file("rules.yaml")), "--json"])
    doc = json.loads(res.output)
    assert doc["ok"] and "KcopsEngineDown" in {r["name"] for r in doc["rules"]}
    res = CliRunner().invoke(cli, ["agent", "default-config", "--json"])
    assert json.loads(res.output)["agent"]["tick_s"] > 0
    good = tmp_path / "good.yaml"
    good.write_text("agent: {tick_s: 2}\n")
    res = CliRunner().invoke(cli, ["agent", "check-config", str(good), "--json"])
    doc = json.loads(res.output)
    assert res.exit_code == 0 and doc["ok"] and doc["config"]["agent"]["tick_s"] == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: {tick_s: -1}\n")
    res = CliRunner().invoke(cli, ["agent", "check-config", str(bad), "--json"])
    doc = json.loads(res.output)
    assert res.exit_code == 2 and not doc["ok"] and "tick_s" in doc["error"]


def test_history_prints_no_epoch_seconds_for_any_record_kind(tmp_path: Path) -> None:
    now = time.time()
    records = [
        {"kind": "action", "ts": now - 60, "action": "notify", "outcome": "ok"},
        {"kind": "escalation", "ts": now - 50, "severity": "ticket",
         "message": "ladder exhausted", "alertname": "KcopsKCSurge"},
        {"kind": "page", "ts": now - 40, "message": "paged"},
        # A kind this CLI does not know: shown as JSON with its times readable.
        {"kind": "future", "ts": now - 30, "started_at": now - 35, "detail": {"until": now + 9}},
    ]  # fmt: skip
    (tmp_path / "audit.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    res = CliRunner().invoke(cli, ["actions", "history", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert not UNIX_SECONDS.search(res.output), res.output
    lines = res.output.splitlines()
    assert "ESCALATION (ticket) KcopsKCSurge: ladder exhausted" in lines[1]
    assert f'"started_at": "{local_iso(now - 35)} (' in lines[3]
    assert f'"until": "{local_iso(now + 9)} (in ' in lines[3]
    res = CliRunner().invoke(cli, ["actions", "history", "--state-dir", str(tmp_path), "--json"])
    assert [json.loads(ln)["ts"] for ln in res.output.splitlines()] == [r["ts"] for r in records]


def test_audit_record_shows_local_time_and_ago() -> None:
    from kcops.agent.remediation.records import ActionRecord
    from kcops.cli.actions import format_record

    now = time.time()
    line = format_record(ActionRecord(ts=now - 180, action="notify", outcome="ok"))
    assert local_iso(now - 180) in line and "(3m ago)" in line
    assert not UNIX_SECONDS.search(line)
