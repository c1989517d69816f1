"""The ``kcops`` command line (click). Entry point: :func:`main`.

Every command is imported when it runs (:mod:`kcops.cli.lazy`), so ``kcops --help`` and
the agent commands work in a slim sidecar image without torch, the lab or the demo.
"""

from __future__ import annotations

import click

from kcops import __version__
from kcops.cli.lazy import LazyGroup

# name -> (module, attribute), imported when the command runs (kcops.cli.lazy). The
# demo's commands come with kcops-demo; the lab's `kc` subcommands with kcops-lab.
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("kcops.cli.agent_cmd", "agent_group"),
    "status": ("kcops.cli.status", "status_cmd"),
    "serve": ("kcops.cli.serve", "serve_cmd"),
    "kc": ("kcops.cli.kc", "kc_group"),
    "alerts": ("kcops.cli.alerts", "alerts_group"),
    "actions": ("kcops.cli.actions", "actions_group"),
    "incident": ("kcops.cli.incident", "incident_group"),
    "demo": ("kcops.demo.cli", "demo_cmd"),
    "runbook": ("kcops.cli.runbook", "runbook_cmd"),
    "diagnose": ("kcops.cli.diagnose", "diagnose_cmd"),
    "top": ("kcops.cli.top", "top_cmd"),
    "load": ("kcops.demo.load.cmd", "load_cmd"),
    "report": ("kcops.cli.report.cmd", "report_cmd"),
    "cost": ("kcops.cli.cost", "cost_cmd"),
    "dashboards": ("kcops.cli.dashboards", "dashboards_group"),
}


@click.group(cls=LazyGroup, lazy=COMMANDS, help="kcops: sidecar agent for LLM inference serving.")
@click.version_option(__version__, prog_name="kcops")
def cli() -> None:
    pass


@cli.command("version", help="Print the kcops version.")
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
def version_cmd(as_json: bool) -> None:
    if as_json:
        import json
        import platform

        click.echo(json.dumps({"version": __version__, "python": platform.python_version()}))
        return
    click.echo(__version__)


def main() -> None:
    cli()
