"""``kcops report --agent URL --since 30m``: the report page from a running agent."""

from __future__ import annotations

import time
from pathlib import Path

import click

from kcops.cli.common import agent_option, handle_errors
from kcops.cli.topdata import AgentClient
from kcops.errors import ConfigError


def write_report(
    agent_url: str, start: float, end: float, out: Path, title: str, extra_html: str = ""
) -> Path:
    """Collect, plot and write the page; returns its path. Needs the ``viz`` extra."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError("kcops report needs matplotlib: pip install 'kcops[viz]'") from None
    from kcops.cli.report.page import render
    from kcops.cli.report.plots import all_pngs
    from kcops.cli.report.timeline import collect

    client = AgentClient(agent_url, timeout_s=10)
    try:
        step = max(1.0, (end - start) / 240)
        tl = collect(client, start, end, step)
        extra_html += cost_section(client, start, end)
    finally:
        client.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(tl, all_pngs(tl), title, extra_html))
    return out


def cost_section(client: AgentClient, start: float, end: float) -> str:
    """``kcops cost``'s table for the window, as HTML (empty when the agent has no such
    series: an engine other than the kcops worker)."""
    from kcops.cli.cost import gather, render_html

    rows = gather(client, start, end)
    return render_html(rows) if rows else ""


@click.command("report", help="Write one self-contained HTML page of plots from a running agent.")
@agent_option
@click.option("--since", default="30m", show_default=True, help="Window: 30m, 2h, an ISO time.")
@click.option(
    "--out", type=click.Path(dir_okay=False), default="kcops-report.html", show_default=True
)
@handle_errors
def report_cmd(agent_url: str, since: str, out: str) -> None:
    from kcops.cli.actions import parse_since

    end = time.time()
    start = parse_since(since, end)
    assert start is not None
    if start >= end:
        raise click.BadParameter(f"{since!r} is not in the past", param_hint="--since")
    path = write_report(agent_url, start, end, Path(out), "kcops report")
    click.echo(f"report written: {path.resolve()}")
