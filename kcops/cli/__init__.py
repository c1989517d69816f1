"""The ``kcops`` command line (click). Entry point: :func:`main`.

Commands that need torch (serve, kc, demo) import it inside the command, so
``kcops --help`` and the agent commands work in a slim sidecar image.
"""

from __future__ import annotations

import click

from kcops import __version__
from kcops.cli.actions import actions_group
from kcops.cli.agent_cmd import agent_group
from kcops.cli.alerts import alerts_group
from kcops.cli.dashboards import dashboards_group
from kcops.cli.demo import demo_cmd
from kcops.cli.diagnose import diagnose_cmd
from kcops.cli.kc import kc_group
from kcops.cli.load.cmd import load_cmd
from kcops.cli.report.cmd import report_cmd
from kcops.cli.runbook import runbook_cmd
from kcops.cli.serve import serve_cmd
from kcops.cli.status import status_cmd
from kcops.cli.top import top_cmd


@click.group(help="kcops: sidecar agent for LLM inference serving.")
@click.version_option(__version__, prog_name="kcops")
def cli() -> None:
    pass


@cli.command("version", help="Print the kcops version.")
def version_cmd() -> None:
    click.echo(__version__)


# Every command module imports its heavy dependencies (torch, textual, matplotlib,
# locust) inside the command, so `kcops --help` works in the slim sidecar image.
for command in (
    agent_group,
    status_cmd,
    serve_cmd,
    kc_group,
    alerts_group,
    actions_group,
    demo_cmd,
    runbook_cmd,
    diagnose_cmd,
    top_cmd,
    load_cmd,
    report_cmd,
    dashboards_group,
):
    cli.add_command(command)


def main() -> None:
    cli()
