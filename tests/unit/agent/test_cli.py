"""CLI conventions: exit codes, check-config, status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from kcops import __version__
from kcops.cli import cli
from tests.services import agent_in_thread, free_port


def test_version() -> None:
    res = CliRunner().invoke(cli, ["version"])
    assert res.exit_code == 0 and res.output.strip() == __version__


def test_check_config_ok_and_bad(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("agent:\n  tick_s: 2\n")
    res = CliRunner().invoke(cli, ["agent", "check-config", str(good)])
    assert res.exit_code == 0 and "ok" in res.output
    for text, key in [
        ("agent:\n  tick_s: nope\n", "agent.tick_s"),
        ("agent:\n  bogus: 1\n", "agent.bogus"),
        ("agent:\n  tick_s: 0\n", "agent.tick_s"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        res = CliRunner().invoke(cli, ["agent", "check-config", str(bad)])
        assert res.exit_code == 2, res.output
        assert key in res.output


def test_agent_run_refuses_bad_config_with_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent:\n  listen: 'nope'\n")
    res = CliRunner().invoke(cli, ["agent", "run", "--config", str(bad)])
    assert res.exit_code == 2
    assert "agent.listen" in res.output


def test_status_unreachable_exits_3() -> None:
    res = CliRunner().invoke(cli, ["status", "--agent", f"http://127.0.0.1:{free_port()}"])
    assert res.exit_code == 3
    assert "cannot reach the agent" in res.output


@pytest.fixture
def live_agent(tmp_path: Path) -> Iterator[str]:
    with agent_in_thread(tmp_path) as url:
        yield url


def test_status_prints_uptime_and_collector_health(live_agent: str) -> None:
    res = CliRunner().invoke(cli, ["status", "--agent", live_agent])
    assert res.exit_code == 0, res.output
    assert "uptime" in res.output
    assert "self: ok" in res.output
    res = CliRunner().invoke(cli, ["status", "--json"], env={"KCOPS_AGENT": live_agent})
    assert res.exit_code == 0 and '"uptime_s"' in res.output


def test_help_lists_groups() -> None:
    res = CliRunner().invoke(cli, ["--help"])
    assert res.exit_code == 0
    for group in ("agent", "status", "alerts", "actions", "kc", "serve", "demo"):
        assert group in res.output
