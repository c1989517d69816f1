"""``kcops top``: one frame for scripts, and the live screen driven headless by textual's pilot."""

from __future__ import annotations

import asyncio
import html
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from kcops.cli import cli
from kcops.cli.topapp import ActionPicker, Confirm, RunbookScreen, TopApp
from kcops.cli.topdata import AgentClient
from kcops.cli.topview import SECTIONS, sparkline
from tests.services import agent_in_thread
from tests.unit.cli.engine_like import EngineLike

TOKEN = "top-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A notify URL makes `notify` applicable; the dry-run agent never posts to it.
CONFIG = {"actions": {"notify": {"url": "http://127.0.0.1:9/unused"}}}


def _agent(tmp_path: Path, engine: EngineLike) -> Iterator[str]:
    with agent_in_thread(
        tmp_path, min_ticks=4, token=TOKEN, config=CONFIG, extra_collectors=[engine]
    ) as url:
        yield url


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    yield from _agent(tmp_path, EngineLike())


def _once(url: str, *extra: str) -> str:
    res = CliRunner().invoke(cli, ["top", "--once", "--agent", url, "--width", "80", *extra])
    assert res.exit_code == 0, res.output
    return res.output


def _run_notify(url: str, times: int) -> None:
    for _ in range(times):
        r = httpx.post(
            url + "/api/v1/actions/notify",
            json={"params": {}, "force": True, "reason": "test"},
            headers=AUTH,
        )
        assert r.status_code == 200, r.text


def test_sparkline_scales_and_keeps_gaps() -> None:
    assert sparkline([0, 1, 2, 3, 4, 5, 6, 7]) == "▁▂▃▄▅▆▇█"
    assert sparkline([1.0, None, 1.0]) == "▅ ▅"
    assert sparkline([None, None]) == "  "


def test_once_shows_every_section_in_80_by_24(agent_url: str) -> None:
    _run_notify(agent_url, 8)  # more audit records than the screen has rows for
    out = _once(agent_url)
    lines = out.splitlines()
    for heading in SECTIONS:
        assert f"── {heading}" in out, heading
    assert "engine ready" in out  # the lifecycle state, not up/down
    assert "p50 150ms p99 950ms" in out  # TTFT and inter-token quantiles
    assert "req/s" in out and "tok/s" in out
    assert "95.0%" in out  # device memory 950 / 1000 MiB
    assert "42.0%" in out  # KV usage
    assert "60.0%" in out  # prefix hits / queries
    assert "N=32" in out and "shadow 97%" in out
    # The real probe labels attention calls by layer, not K(C): top says so.
    assert "no K(C) per layer from this probe; calls/s" in out and "▅▅▅▅ 4" in out
    # Only active alerts get a row; the inactive ones are a count.
    active = [ln for ln in lines if " pending " in ln or " firing " in ln]
    assert any("KcopsDeviceMemoryHigh" in ln for ln in active)
    assert re.search(rf"alerts: {len(active)} active, \d+ inactive", out)
    assert "KcopsEngineDown" not in out
    assert "notify" in out and "ago" in out
    assert len(lines) <= 24 and max(len(line) for line in lines) <= 80


def test_once_shows_k_c_per_layer_where_the_probe_reports_it(tmp_path: Path) -> None:
    for url in _agent(tmp_path, EngineLike(kc_by_layer=True)):
        out = _once(url)
        # Layer i has its K(C) in bucket i+1 (16, 32, 64, 128 tokens): rising per layer.
        row = next(ln for ln in out.splitlines() if ln.startswith("layers"))
        assert "4 layers" in row and "max " in row
        spark = row.split("K(C) p50 ", 1)[1].split()[0]
        assert len(spark) == 4 and list(spark) == sorted(spark)


@pytest.mark.parametrize("state", ["starting", "hung", "down"])
def test_once_shows_the_engine_lifecycle_state(tmp_path: Path, state: str) -> None:
    for url in _agent(tmp_path, EngineLike(state=state)):
        assert f"engine {state}" in _once(url)


def test_once_json_has_the_frame_for_scripts(agent_url: str) -> None:
    res = CliRunner().invoke(cli, ["top", "--once", "--json", "--agent", agent_url])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["engine_state"] == "ready"
    assert doc["values"]["kv_usage"] == pytest.approx(0.42)
    assert "KcopsDeviceMemoryHigh" in {a["alertname"] for a in doc["alerts"]}
    assert "KcopsEngineDown" in doc["inactive_alerts"]
    assert len(doc["attention_calls_by_layer"]) == 4 and doc["kc_by_layer"] == {}
    bad = CliRunner().invoke(cli, ["top", "--json", "--agent", agent_url])
    assert bad.exit_code == 2 and "--once" in bad.output


def test_once_unreachable_exits_3() -> None:
    res = CliRunner().invoke(cli, ["top", "--once", "--agent", "http://127.0.0.1:9"])
    assert res.exit_code == 3 and "cannot reach the agent" in res.output


def screen_text(app: TopApp) -> str:
    """The text of the screen as the terminal shows it, from textual's own screenshot."""
    svg = app.export_screenshot()
    rows: dict[float, list[str]] = {}
    for m in re.finditer(r'<text[^>]*\by="([\d.]+)"[^>]*>(.*?)</text>', svg, re.S):
        rows.setdefault(float(m.group(1)), []).append(
            html.unescape(re.sub("<[^>]+>", "", m.group(2)))
        )
    return "\n".join("".join(parts).replace("\xa0", " ") for _, parts in sorted(rows.items()))


async def _until(pilot: object, cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        await pilot.pause(0.05)  # type: ignore[attr-defined]


def test_live_view_shows_every_section_at_80_by_24(agent_url: str) -> None:
    _run_notify(agent_url, 8)
    app = TopApp(AgentClient(agent_url), lambda: AUTH, 0.5)
    seen: dict[str, str] = {}

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await _until(pilot, lambda: app.frames >= 1, "first frame")
            await pilot.pause(0.1)
            seen["text"] = screen_text(app)

    asyncio.run(go())
    text = seen["text"]
    for heading in SECTIONS:
        assert f"── {heading}" in text, (heading, text)
    assert "engine ready" in text and "KcopsDeviceMemoryHigh" in text
    assert "KcopsEngineDown" not in text  # inactive: counted, not listed
    assert "notify" in text  # the newest actions fit below the alerts
    assert "q quit" in text  # the footer with the keys


def _drive(agent_url: str, token: str) -> TopApp:
    app = TopApp(AgentClient(agent_url), lambda: {"Authorization": f"Bearer {token}"}, 0.5)

    async def go() -> None:
        async with app.run_test(size=(80, 24)) as pilot:
            await _until(pilot, lambda: app.frames >= 1, "first frame")
            # Firing and the longest-pending first: the memory alert heads the table.
            assert app.selected_alert() == "KcopsDeviceMemoryHigh"
            await pilot.press("r")
            await _until(pilot, lambda: isinstance(app.screen, RunbookScreen), "runbook screen")
            await pilot.press("escape")
            await _until(pilot, lambda: not isinstance(app.screen, RunbookScreen), "runbook closed")
            await pilot.press("x")
            await _until(pilot, lambda: isinstance(app.screen, ActionPicker), "action picker")
            picker = app.screen
            assert isinstance(picker, ActionPicker)
            # Choose `notify` as on-call would: arrow keys down the list, then enter.
            await pilot.press(*["down"] * picker.names.index("notify"), "enter")
            await _until(pilot, lambda: isinstance(app.screen, Confirm), "confirmation")
            assert isinstance(app.screen, Confirm) and "notify" in app.screen.question
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
    mine = [r for r in records if r.get("action") == "notify" and r.get("outcome") == "dry_run"]
    assert mine and mine[-1]["reason"] == "kcops top (on-call)"


@pytest.mark.slow
def test_live_view_with_a_wrong_token_is_refused(agent_url: str) -> None:
    app = _drive(agent_url, "wrong")
    assert app.last_result is not None and app.last_result["http_status"] == 401
    records = httpx.get(agent_url + "/api/v1/actions/history").json()["records"]
    assert not any(r.get("action") == "notify" for r in records)
