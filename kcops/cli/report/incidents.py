"""The report's incidents: those opened in its window, each with where it hung."""

from __future__ import annotations

import html

from kcops.cli.common import Doc
from kcops.cli.incident import fetch_list, fetch_record, where_hung
from kcops.cli.report.page import _table
from kcops.cli.timefmt import as_float, local_iso
from kcops.errors import KcopsError

MAX_SHOWN = 20  # newest first: each one shown costs a request for its stacks


def incidents_section(
    agent_url: str | None, start: float, end: float, headers: dict[str, str]
) -> str:
    """HTML: a table of the incidents an agent opened in ``start..end``; a line saying why
    there is none (a Prometheus keeps no incident, no token, an older agent)."""
    head = "<h2>Incidents</h2>"
    if agent_url is None:
        return (
            head + "<p>Each agent keeps its own: <code>kcops incident list --agent URL</code>.</p>"
        )
    if not headers:
        return head + "<p>Not read: the incident API needs KCOPS_TOKEN or --token-file.</p>"
    try:
        got = [
            r for r in fetch_list(agent_url, headers)
            if start <= (as_float(r.get("opened_at")) or 0.0) <= end
        ]  # fmt: skip
        rows = [_row(agent_url, r, headers) for r in got[:MAX_SHOWN]]
    except KcopsError as exc:
        return head + f"<p>Not read: {html.escape(str(exc))}</p>"
    if not rows:
        return head + "<p>No incident was opened in this window.</p>"
    more = f"<p>{len(got) - MAX_SHOWN} older ones: <code>kcops incident list</code>.</p>"
    table = _table(["id", "trigger", "opened", "status", "where it hung"], rows)
    return head + table + (more if len(got) > MAX_SHOWN else "")


def _row(agent_url: str, manifest: Doc, headers: dict[str, str]) -> list[str]:
    where = where_hung(fetch_record(agent_url, str(manifest.get("id")), headers))
    return [
        str(manifest.get("id")),
        str(manifest.get("trigger")),
        local_iso(as_float(manifest.get("opened_at"))),
        str(manifest.get("status")),
        where or "no stacks",
    ]
