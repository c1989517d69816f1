"""The report as one HTML file: PNGs inline as data URIs, inline CSS, no scripts.

Nothing on the page is fetched: it opens the same with no network.
"""

from __future__ import annotations

import base64
import html

from kcops.cli.report.timeline import Timeline
from kcops.cli.timefmt import duration, local_iso

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1040px; }
img { display: block; width: 1000px; margin: 0.4em 0; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0 1.5em; }
td, th { border-bottom: 1px solid #ddd; padding: 0.2em 0.8em; text-align: left; }
.firing { color: #c0302a; } .pending { color: #a07800; }
"""


STATES = ("firing", "pending")  # the states the page colours; any other is plain text


def _table(head: list[str], rows: list[list[str]], state_col: int | None = None) -> str:
    """Every cell is text, escaped here, so a value from outside (an alert's name, its
    state as Prometheus answered it, an engine's answer) is never markup."""

    def cell(i: int, text: str) -> str:
        css = f' class="{text}"' if i == state_col and text in STATES else ""
        return f"<td{css}>{html.escape(text)}</td>"

    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(cell(i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def render(tl: Timeline, pngs: list[tuple[str, bytes]], title: str, extra_html: str = "") -> str:
    esc = html.escape
    imgs = "\n".join(
        f'<img alt="{esc(t)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for t, png in pngs
    )
    alerts = _table(
        ["alert", "state", "from", "for"],
        [
            [iv.alertname, iv.state, local_iso(iv.start), duration(iv.end - iv.start)]
            for iv in tl.intervals
        ],
        state_col=1,
    )
    actions = _table(
        ["time", "action", "outcome", "alert", "detail"],
        [
            [local_iso(float(r["ts"])), str(r.get("action")), str(r.get("outcome")),
             str((r.get("ladder") or {}).get("alertname", "")),
             str(r.get("detail") or r.get("error") or "")[:200]]
            for r in tl.actions
        ],
    )  # fmt: skip
    window = f"{local_iso(tl.start)} to {local_iso(tl.end)} ({duration(tl.end - tl.start)})"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title><style>{CSS}</style></head>
<body>
<h1>{esc(title)}</h1>
<p>Agent {esc(tl.agent_url.split("://", 1)[-1])}, {esc(window)}.
One time axis for every plot; shaded bands are alerts (amber pending, red firing),
dashed lines are remediation actions.</p>
{extra_html}
{imgs}
<h2>Alert intervals</h2>
{alerts if tl.intervals else "<p>No alert was pending or firing.</p>"}
<h2>Actions</h2>
{actions if tl.actions else "<p>No action ran.</p>"}
</body></html>
"""
