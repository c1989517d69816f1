"""``kcops top``: one frame for scripts, and the live screen driven headless by textual's pilot."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from kcops.cli import cli
from kcops.cli.topapp import ActionPicker, Confirm, RunbookScreen, TopApp
from kcops.cli.topdata import AgentClient
from kcops.cli.topview import sparkline
from tests.services import agent_in_thread
from tests.unit.cli.engine_like import EngineLike

TOKEN = "top-test-token"


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    # A notify URL makes `notify` applicable; the dry-run agent never posts to it.
    with agent_in_thread(
        tmp_path,
        min_ticks=4,
        token=TOKEN,
        config={"actions": {"notify": {"url": "http://127.0.0.1:9/unused"}}},
        extra_collectors=[EngineLike()],
    ) as url:
        yield url


def test_sparkline_scales_and_keeps_gaps() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([1.0, None, 1.0]) == "▅ ▅"
    assert sparkline([None, None]) == "  "


def test_once_shows_every_section_in_80_columns(agent_url: str) -> None:
    res = CliRunner().invoke(cli, ["top", "--once", "--agent", agent_url, "--width", "80"])
    assert res.exit_code == 0, res.output
    out = res.output
    for heading in ("serving", "cache and memory", "attention", "alerts", "last actions"):
        assert f"── {heading}" in out
    assert "engine UP" in out
    assert "95.0%" in out  # device memory 950 / 1000 MiB
    assert "42.0%" in out  # KV usage
    assert "60.0%" in out  # prefix hits / queries
    assert "N=32" in out and "shadow 97.0%" in out
    assert "4 layers" in out  # attention calls by layer
    assert "KcopsDeviceMemoryHigh" in out and "pending" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_once_unreachable_exits_3() -> None:
    res = CliRunner().invoke(cli, ["top", "--once", "--agent", "http://127.0.0.1:9"])
    assert res.exit_code == 3 and "cannot reach the agent" in res.output


async def _until(pilot: object, cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await pilot.pause(0.05)  # type: ignore[attr-defined]


def _drive(agent_url: str, token: str) -> TopApp:
    app = TopApp(AgentClient(agent_url), lambda: {"Authorization": f"Bearer {token}"}, 0.5)

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await _until(pilot, lambda: app.frames >= 1, "first frame")
            # The pending memory alert is the first row: its runbook opens on `r`.
            assert app.selected_alert() == "KcopsDeviceMemoryHigh"
            await pilot.press("r")
            await _until(pilot, lambda: isinstance(app.screen, RunbookScreen), "runbook screen")
            await pilot.press("escape")
            await _until(pilot, lambda: not isinstance(app.screen, RunbookScreen), "runbook closed")
            await pilot.press("x")
            await _until(pilot, lambda: isinstance(app.screen, ActionPicker), "action picker")
            picker = app.screen
            assert isinstance(picker, ActionPicker)
            picker.dismiss("notify")
            await _until(pilot, lambda: isinstance(app.screen, Confirm), "confirmation")
            await pilot.press("y")
            await _until(pilot, lambda: app.last_result is not None, "action result")

    asyncio.run(go())
    return app


@pytest.mark.slow
def test_live_view_opens_runbook_and_runs_an_action(agent_url: str) -> None:
    app = _drive(agent_url, TOKEN)
    assert app.last_result is not None
    # The agent runs in dry-run mode: the action went through its guards and was recorded.
    assert app.last_result.get("outcome") == "dry_run", app.last_result
    records = httpx.get(agent_url + "/api/v1/actions/history").json()["records"]
    assert any(r.get("action") == "notify" and r.get("outcome") == "dry_run" for r in records)


@pytest.mark.slow
def test_live_view_with_a_wrong_token_is_refused(agent_url: str) -> None:
    app = _drive(agent_url, "wrong")
    assert app.last_result is not None and app.last_result["http_status"] == 401
    records = httpx.get(agent_url + "/api/v1/actions/history").json()["records"]
    assert not any(r.get("action") == "notify" for r in records)
