"""`kcops report`: the range query it reads, its PNGs and its self-contained page."""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from kcops.cli import cli
from kcops.cli.report.plots import DPI, HEIGHT_IN, WIDTH_IN
from kcops.cli.report.timeline import PANELS
from kcops.errors import KcopsError
from tests.services import agent_in_thread
from tests.unit.cli.engine_like import EngineLike

pytest.importorskip("matplotlib")


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    with agent_in_thread(tmp_path, min_ticks=20, extra_collectors=[EngineLike()]) as url:
        yield url


def test_range_query_matches_instant_queries(agent_url: str) -> None:
    now = round(time.time(), 3)
    start, step = now - 1.5, 0.25
    expr = "max(kcops_device_memory_used_bytes) + 0"
    body = httpx.get(
        agent_url + "/api/v1/query_range",
        params={"query": expr, "start": start, "end": now, "step": step},
    ).json()
    assert body["status"] == "success" and body["data"]["resultType"] == "matrix"
    (series,) = body["data"]["result"]
    for t, v in series["values"]:
        inst = httpx.get(agent_url + "/api/v1/query", params={"query": expr, "time": t}).json()
        assert inst["data"]["result"][0]["value"][1] == v
    bad = httpx.get(
        agent_url + "/api/v1/query_range",
        params={"query": expr, "start": 0, "end": 1e9, "step": 1},
    )
    assert bad.status_code == 400 and "at most 11000" in bad.json()["error"]
    bad = httpx.get(agent_url + "/api/v1/query_range", params={"query": expr, "start": "nan"})
    assert bad.status_code == 400 and "finite" in bad.json()["error"]


def test_matrix_asks_in_pieces_and_halves_a_piece_the_budget_refuses(agent_url: str) -> None:
    from kcops.cli.topdata import CHUNK_STEPS, AgentClient

    # Each step costs 9,000 subquery steps: 120 of them (one piece) are past the agent's
    # work budget (4.3M units of 4M), and so is the whole range; in halves they pass.
    expr = "count_over_time(vector(1)[15m:100ms])"
    start, step = 1_000_000.0, 1.0
    whole = httpx.get(
        agent_url + "/api/v1/query_range",
        params={"query": expr, "start": start, "end": start + 129, "step": step},
    )
    assert whole.status_code == 422 and whole.json()["errorType"] == "execution"
    client = AgentClient(agent_url, timeout_s=60)
    try:
        ((labels, pts),) = client.matrix(expr, start, start + 129, step)
        assert labels == {} and len(pts) == 130 > CHUNK_STEPS
        assert sorted(pts) == [start + i for i in range(130)]
        assert set(pts.values()) == {9001.0}  # both ends of the range
        # a single step the budget refuses is an error, not an empty answer
        with pytest.raises(KcopsError, match="HTTP 422"):
            client.matrix("count_over_time(vector(1)[1h:1ms])", start, start + 10, step)
    finally:
        client.http.close()


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


@pytest.mark.slow
def test_report_page_is_self_contained_with_pngs_of_the_expected_size(
    agent_url: str, tmp_path: Path
) -> None:
    import base64

    out = tmp_path / "r.html"
    res = CliRunner().invoke(
        cli, ["report", "--agent", agent_url, "--since", "1m", "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    page = out.read_text()
    pngs = [base64.b64decode(b) for b in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]
    assert len(pngs) == len(PANELS) + 1
    for png in pngs:
        assert _png_size(png) == (int(WIDTH_IN * DPI), int(HEIGHT_IN * DPI))
        assert len(png) > 5000  # axes, ticks and lines, not a blank image
    # Nothing to fetch: no scripts, stylesheets or images from anywhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert "<script" not in page and "<link" not in page
    # The memory alert was pending during the window: it has its interval row.
    assert re.search(r"KcopsDeviceMemoryHigh</td><td class=\"pending\">pending</td>", page)
