"""``kcops diagnose``: one report of what a running agent knows, for an incident channel."""

from __future__ import annotations

from typing import Any

import click

from kcops.cli.common import (
    Doc,
    agent_get_json,
    agent_option,
    agent_request,
    echo_json,
    handle_errors,
)
from kcops.cli.status import format_status
from kcops.cli.timefmt import ago, as_float, when


def _optional(agent_url: str, path: str) -> Any:
    """A route that a component may not serve: None when it is not there."""
    resp = agent_request("GET", agent_url, path)
    if resp.status_code == 404:
        return None
    resp.raise_for_status()
    return resp.json()


def gather(agent_url: str) -> Doc:
    return {
        "status": agent_get_json(agent_url, "/api/v1/status"),
        "alerts": _optional(agent_url, "/api/v1/alerts"),
        "remediation": _optional(agent_url, "/api/v1/remediation"),
        "history": _optional(agent_url, "/api/v1/actions/history?limit=10"),
    }


def problems(report: Doc) -> list[str]:
    """Plain findings, most urgent first."""
    out = []
    alerts = (report.get("alerts") or {}).get("alerts", [])
    for a in alerts:
        if a.get("state") == "firing":
            out.append(f"alert firing: {a['alertname']} — run `kcops runbook {a['alertname']}`")
    comps = report["status"].get("components", {})
    for name, h in comps.get("collectors", {}).get("collectors", {}).items():
        if not h.get("ok"):
            out.append(f"collector {name} unavailable: {h.get('error')}")
    for name, c in comps.items():
        if name != "collectors" and not c.get("healthy", True):
            out.append(f"component {name} unhealthy: {c.get('summary') or c.get('error')}")
    return out


@click.command("diagnose", help="Print status, alerts, remediation and recent actions at once.")
@agent_option
@click.option("--json", "as_json", is_flag=True, help="Print the gathered JSON.")
@handle_errors
def diagnose_cmd(agent_url: str, as_json: bool) -> None:
    report = gather(agent_url)
    if as_json:
        echo_json({**report, "problems": problems(report)})
        return
    click.echo(format_status(report["status"]))
    found = problems(report)
    click.echo("\nfindings:" if found else "\nfindings: none")
    for line in found:
        click.echo(f"  - {line}")
    alerts = (report.get("alerts") or {}).get("alerts", [])
    if alerts:
        click.echo("\nalerts:")
        for a in alerts:
            since = a.get("fired_at") if a["state"] == "firing" else a.get("active_since")
            click.echo(
                f"  {a['state']:8} {a['alertname']} since {when(as_float(since))} "
                f"{a.get('labels', {})}"
            )
    hist = report.get("history")
    records = hist.get("records", hist) if isinstance(hist, dict) else (hist or [])
    if records:
        click.echo("\nrecent actions:")
        for r in records[-10:]:
            click.echo(
                f"  {ago(as_float(r.get('ts'))):>9}  {r.get('action', r.get('event', '?')):18} "
                f"{r.get('outcome', ''):10} {r.get('alertname', '')}"
            )
