"""The ``kcops`` command line (click). Entry point: :func:`main`.

Commands that need torch (serve, kc, demo) import it inside the command, so
``kcops --help`` and the agent commands work in a slim sidecar image.
"""

from __future__ import annotations

import click

from kcops import __version__
from kcops.agent.cli.agent_cmd import agent_group
from kcops.agent.cli.common import not_built
from kcops.agent.cli.status import status_cmd


@click.group(help="kcops: sidecar agent for LLM inference serving.")
@click.version_option(__version__, prog_name="kcops")
def cli() -> None:
    pass


@cli.command("version", help="Print the kcops version.")
def version_cmd() -> None:
    click.echo(__version__)


cli.add_command(agent_group)
cli.add_command(status_cmd)


def _add_optional(module: str, attr: str, name: str, issue: str) -> None:
    """Register a command from its module; a group not built yet says so."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        cli.add_command(not_built(name, issue))
        return
    cli.add_command(getattr(mod, attr), name)


_add_optional("kcops.agent.cli.serve", "serve_cmd", "serve", "issue 4: reference worker")
_add_optional("kcops.agent.cli.kc", "kc_group", "kc", "issue 3: K(C) probe")
_add_optional("kcops.agent.cli.alerts", "alerts_group", "alerts", "issue 6: alert rules")
_add_optional("kcops.agent.cli.actions", "actions_group", "actions", "issue 7: remediation")
_add_optional("kcops.agent.cli.demo", "demo_cmd", "demo", "foundation")
_add_optional("kcops.agent.cli.runbook", "runbook_cmd", "runbook", "runbooks: not scheduled yet")
_add_optional("kcops.agent.cli.diagnose", "diagnose_cmd", "diagnose", "not scheduled yet")
_add_optional("kcops.agent.cli.top", "top_cmd", "top", "issue 15: live view")
_add_optional("kcops.agent.cli.load.cmd", "load_cmd", "load", "issue 15: Locust load")
_add_optional("kcops.agent.cli.report.cmd", "report_cmd", "report", "issue 15: report page")
_add_optional(
    "kcops.agent.cli.dashboards", "dashboards_group", "dashboards", "dashboards: not scheduled yet"
)


def main() -> None:
    cli()
