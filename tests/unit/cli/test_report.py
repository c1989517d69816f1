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
    assert re.search(r"KcopsDeviceMemoryHigh</td><td><span class=\"pending\">", page)
