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


def test_audit_record_shows_local_time_and_ago() -> None:
    from kcops.cli.actions import format_record

    now = time.time()
    line = format_record({"kind": "action", "ts": now - 180, "action": "notify", "outcome": "ok"})
    assert local_iso(now - 180) in line and "(3m ago)" in line
    assert not UNIX_SECONDS.search(line)
