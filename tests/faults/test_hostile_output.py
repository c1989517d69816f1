"""Every value from outside that kcops writes into a page or a table stays text: an alert's
name or state as Prometheus answered it, an action's detail as an engine answered it, a
model or tenant name. HTML pages escape it; text tables keep each row on one line and
never pass a control character to the terminal."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from kcops.agent.remediation.records import ActionRecord
from kcops.cli.actions import format_record
from kcops.cli.common import one_line
from kcops.cli.cost import CostRow, render_html, render_text
from kcops.cli.report.page import render
from kcops.cli.report.timeline import Interval, Timeline
from kcops.cli.status import format_status

HOSTILE = [
    '"><img src=x onerror=alert(1)>',
    "<script>alert(1)</script>",
    "a\nb\r\nc",
    "\x1b[2J\x1b[31mred",
    "rtl\u202eevil",
    "tab\there\x00nul",
]


class Tags(HTMLParser):
    """Every tag and attribute the page really holds."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def markup_of(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    return tags


@pytest.mark.parametrize("value", HOSTILE)
def test_the_report_page_escapes_every_field(value: str) -> None:
    tl = Timeline(
        agent_url=f"http://{value}",
        times=[0.0, 60.0],
        series={},
        intervals=[Interval(value, value, 0.0, 30.0), Interval(value, "firing", 30.0, 60.0)],
        actions=[{"ts": 10.0, "action": value, "outcome": value, "detail": value,
                  "ladder": {"alertname": value}}],
    )  # fmt: skip
    page = render(tl, [(value, b"png")], value, "")
    tags = markup_of(page)
    assert [t for t, _ in tags.tags if t in ("script", "img")] == ["img"]  # the one plot
    attrs = {name for _, a in tags.tags for name, _ in a}
    assert attrs <= {"charset", "alt", "src", "class"}, attrs
    classes = {v for _, a in tags.tags for name, v in a if name == "class"}
    assert classes <= {"firing", "pending"}, classes


@pytest.mark.parametrize("value", HOSTILE)
def test_the_cost_table_keeps_a_row_a_line_and_its_page_escapes(value: str) -> None:
    rows = [CostRow(value, value, queries=3, context_tokens=30), CostRow("m", "t", queries=1)]
    text = render_text(rows)
    assert len(text.splitlines()) == 2 + len(rows) + 2  # head, rule, rows, rule, total
    assert "\x1b" not in text and "\x00" not in text and "\u202e" not in text
    tags = markup_of(render_html(rows))
    assert {t for t, _ in tags.tags} <= {"h2", "p", "table", "tr", "th", "td"}


@pytest.mark.parametrize("value", HOSTILE)
def test_history_and_status_lines_stay_one_printable_line(value: str) -> None:
    line = format_record(ActionRecord(ts=0.0, action="notify", outcome="ok", detail=value))
    assert "\n" not in line and "\x1b" not in line and "\u202e" not in line
    status = {"version": "x", "pid": 1, "uptime_s": 1, "ticks": 1, "tick_s": 1, "series": 0,
              "mode": value, "engine_url": value,
              "components": {value: {"summary": value}}}  # fmt: skip
    text = format_status(status, now=10.0)
    assert len(text.splitlines()) == 6 and "\x1b" not in text


def test_one_line_writes_controls_as_escapes() -> None:
    assert one_line("a\nb\x1b\u202e") == "a\\nb\\x1b\\u202e"
    assert one_line("ünïcode ok") == "ünïcode ok"
