"""``kcops report --since 30m``: the report page from a running agent (``--agent``), or
from the Prometheus that scrapes every pod (``--prometheus``, optionally ``--selector``):
the same panels, alerts and cost table, over the part of the window the source holds
(said on the page); the actions taken come from an agent only."""

from __future__ import annotations

import html
from pathlib import Path

import click

from kcops.cli.common import handle_errors
from kcops.cli.source import Source, source_options
from kcops.errors import ConfigError


def write_report(
    source: Source | str, start: float, end: float, out: Path, title: str, extra_html: str = ""
) -> Path:
    """Collect, plot and write the page; returns its path. Needs the ``viz`` extra.
    ``source``: a :class:`Source`, or an agent's URL."""
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise ConfigError("kcops report needs matplotlib: pip install 'kcops[viz]'") from None
    from kcops.cli.report.page import render
    from kcops.cli.report.plots import all_pngs
    from kcops.cli.report.timeline import collect

    src = Source(source, "agent") if isinstance(source, str) else source
    try:
        cover = src.coverage(start, end)
        start = min(cover.start, end - 1.0)
        step = max(1.0, (end - start) / 240)
        alerts = src.sel("ALERTS") if src.selector else "ALERTS"
        tl = collect(src.client, start, end, step, src.narrow, alerts)
        window = f"<p>{html.escape(cover.line(src.what))}</p>"
        extra_html = window + extra_html + cost_section(src, start, end)
    finally:
        if isinstance(source, str):
            src.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(tl, all_pngs(tl), title, extra_html))
    return out


def cost_section(source: Source, start: float, end: float) -> str:
    """``kcops cost``'s table for the window, as HTML (empty when the source has no such
    series: an engine that reports no requests)."""
    from kcops.cli.cost import gather, render_html

    rows = gather(source.client, start, end, source.sel)
    return render_html(rows) if rows else ""


@click.command(
    "report",
    help="Write one self-contained HTML page of plots, alerts and cost: from a running agent "
    "(--agent), or from the Prometheus that scrapes every pod (--prometheus).",
)
@source_options
@click.option("--since", default="30m", show_default=True, help="Window: 30m, 2h, an ISO time.")
@click.option(
    "--out", type=click.Path(dir_okay=False), default="kcops-report.html", show_default=True
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="Bearer token file, to read the incidents (else $KCOPS_TOKEN).",
)
@handle_errors
def report_cmd(source: Source, since: str, out: str, token_file: str | None) -> None:
    from kcops.cli.actions import past_window
    from kcops.cli.common import token_headers
    from kcops.cli.report.incidents import incidents_section

    start, end = past_window(since)
    agent = source.url if source.kind == "agent" else None
    incidents = incidents_section(agent, start, end, token_headers(token_file))
    path = write_report(source, start, end, Path(out), "kcops report", incidents)
    click.echo(f"report written: {path.resolve()}")
