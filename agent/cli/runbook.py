"""``kcops runbook NAME``: an alert's runbook, walked against live data.

Prints the runbook, then asks the running agent for the alert's current
state, its expression's value now, and the value of every PromQL query the
runbook's checks quote (inline code that parses as PromQL and names a kcops
series). Without an agent (``--offline``) it prints the runbook alone.
"""

from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import click

from kcops.agent.cli.common import (
    EXIT_USAGE,
    agent_get_json,
    agent_option,
    agent_request,
    handle_errors,
)

INLINE_CODE = re.compile(r"`([^`\n]+)`")


def runbook_names() -> list[str]:
    root = resources.files("kcops.runbooks")
    return sorted(p.name[:-3] for p in root.iterdir() if p.name.endswith(".md"))


def runbook_text(name: str) -> str:
    ref = resources.files("kcops.runbooks").joinpath(f"{name}.md")
    return Path(str(ref)).read_text()


def runbook_queries(text: str) -> list[str]:
    """Inline code spans that are PromQL over kcops series, in order, without repeats."""
    import promql_parser

    from kcops.agent.signals import SIGNALS

    out: list[str] = []
    for snippet in INLINE_CODE.findall(text):
        if "kcops_" not in snippet or snippet in out:
            continue
        meta = SIGNALS.get(snippet)
        if meta is not None and meta.type == "histogram":
            continue  # a histogram's family name is no series; its queries are quoted apart
        try:
            promql_parser.parse(snippet)
        except ValueError:
            continue
        out.append(snippet)
    return out


def _fmt_result(data: dict[str, Any]) -> list[str]:
    if data["resultType"] in ("scalar", "string"):
        return [str(data["result"][1])]
    rows = []
    for r in data["result"][:10]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()))
        rows.append(f"{r['value'][1]}  {{{labels}}}")
    if len(data["result"]) > 10:
        rows.append(f"... {len(data['result']) - 10} more")
    return rows or ["(no data)"]


def _query(agent_url: str, expr: str) -> list[str]:
    resp = agent_request("GET", agent_url, "/api/v1/query?" + _qs(expr))
    body = resp.json()
    if body.get("status") != "success":
        return [f"error: {body.get('error')}"]
    return _fmt_result(body["data"])


def _qs(expr: str) -> str:
    from urllib.parse import urlencode

    return urlencode({"query": expr})


@click.command("runbook", help="Show an alert's runbook and run its checks against live data.")
@click.argument("name", required=False)
@agent_option
@click.option("--offline", is_flag=True, help="Print the runbook only; do not ask the agent.")
@handle_errors
def runbook_cmd(name: str | None, agent_url: str, offline: bool) -> None:
    names = runbook_names()
    if not name:
        click.echo("runbooks: " + ", ".join(names))
        return
    if name not in names:
        click.echo(f"error: no runbook {name!r}; known: {', '.join(names)}", err=True)
        sys.exit(EXIT_USAGE)
    text = runbook_text(name)
    click.echo(text.rstrip())
    if offline:
        return
    click.echo("\n## Live data from " + agent_url)
    alerts = agent_get_json(agent_url, "/api/v1/alerts").get("alerts", [])
    mine = [a for a in alerts if a.get("alertname") == name]
    if not mine:
        click.echo(f"- {name}: inactive")
    for a in mine:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a.get("labels", {}).items()))
        click.echo(f"- {name}: {a['state']} since {a.get('active_since')} {{{labels}}}")
    rules = agent_get_json(agent_url, "/api/v1/rules").get("rules", [])
    rule = next((r for r in rules if r.get("name") == name), None)
    if rule is not None and rule.get("expr"):
        click.echo(f"- the alert's expression now: {' '.join(rule['expr'].split())}")
        for row in _query(agent_url, rule["expr"]):
            click.echo(f"    {row}")
    for expr in runbook_queries(text):
        click.echo(f"- {expr}")
        for row in _query(agent_url, expr):
            click.echo(f"    {row}")
