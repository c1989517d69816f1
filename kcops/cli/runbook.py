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

import click

from kcops.cli.common import (
    EXIT_USAGE,
    Doc,
    agent_get_json,
    agent_option,
    agent_request,
    echo_json,
    handle_errors,
    one_line,
)
from kcops.cli.timefmt import as_float, when

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


def _fmt_result(data: Doc) -> list[str]:
    if data["resultType"] in ("scalar", "string"):
        return [str(data["result"][1])]
    rows = []
    for r in data["result"][:10]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(r["metric"].items()))
        rows.append(f"{r['value'][1]}  {{{labels}}}")
    if len(data["result"]) > 10:
        rows.append(f"... {len(data['result']) - 10} more")
    return rows or ["(no data)"]


def _query(agent_url: str, expr: str) -> Doc:
    """The query API's answer: ``{"status": ..., "data": ...}`` or an error body."""
    resp = agent_request("GET", agent_url, "/api/v1/query?" + _qs(expr))
    body: Doc = resp.json()
    return body


def _rows(body: Doc) -> list[str]:
    if body.get("status") != "success":
        return [f"error: {body.get('error')}"]
    return _fmt_result(body["data"])


def _qs(expr: str) -> str:
    from urllib.parse import urlencode

    return urlencode({"query": expr})


def live_data(agent_url: str, name: str, text: str) -> Doc:
    """The alert's state, its expression's value now and each check's value, as JSON."""
    alerts = agent_get_json(agent_url, "/api/v1/alerts").get("alerts", [])
    rules = agent_get_json(agent_url, "/api/v1/rules").get("rules", [])
    rule = next((r for r in rules if r.get("name") == name), None)
    expr = " ".join(rule["expr"].split()) if rule is not None and rule.get("expr") else None
    return {
        "agent": agent_url,
        "alerts": [a for a in alerts if a.get("alertname") == name],
        "expr": expr,
        "expr_result": _query(agent_url, expr) if expr else None,
        "checks": [{"expr": q, "result": _query(agent_url, q)} for q in runbook_queries(text)],
    }


def print_live(name: str, live: Doc) -> None:
    click.echo("\n## Live data from " + live["agent"])
    if not live["alerts"]:
        click.echo(f"- {name}: inactive")
    for a in live["alerts"]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a.get("labels", {}).items()))
        since = a.get("fired_at") if a["state"] == "firing" else a.get("active_since")
        click.echo(one_line(f"- {name}: {a['state']} since {when(as_float(since))} {{{labels}}}"))
    if live["expr"]:
        click.echo(f"- the alert's expression now: {live['expr']}")
        for row in _rows(live["expr_result"]):
            click.echo(f"    {row}")
    for check in live["checks"]:
        click.echo(f"- {check['expr']}")
        for row in _rows(check["result"]):
            click.echo(f"    {row}")


@click.command("runbook", help="Show an alert's runbook and run its checks against live data.")
@click.argument("name", required=False)
@agent_option
@click.option("--offline", is_flag=True, help="Print the runbook only; do not ask the agent.")
@click.option("--json", "as_json", is_flag=True, help="Print the runbook and live data as JSON.")
@handle_errors
def runbook_cmd(name: str | None, agent_url: str, offline: bool, as_json: bool) -> None:
    names = runbook_names()
    if not name:
        if as_json:
            echo_json({"runbooks": names})
        else:
            click.echo("runbooks: " + ", ".join(names))
        return
    if name not in names:
        click.echo(f"error: no runbook {name!r}; known: {', '.join(names)}", err=True)
        sys.exit(EXIT_USAGE)
    text = runbook_text(name)
    live = None if offline else live_data(agent_url, name, text)
    if as_json:
        echo_json({"name": name, "text": text, "live": live})
        return
    click.echo(text.rstrip())
    if live is not None:
        print_live(name, live)
