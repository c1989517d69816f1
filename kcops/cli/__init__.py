"""The ``kcops`` command line (click). Entry point: :func:`main`.

Commands that need torch (serve, kc, demo) import it inside the command, so
``kcops --help`` and the agent commands work in a slim sidecar image.
"""

from __future__ import annotations

import importlib

import click

from kcops import __version__

# name -> (module, attribute). A command's module is imported only when that command
# runs (or `--help` lists them all): `kcops agent run` then carries the agent's
# imports alone, not those of every other command (rich, the demo, the load tool),
# which is part of keeping the idle sidecar's RSS down.
COMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("kcops.cli.agent_cmd", "agent_group"),
    "status": ("kcops.cli.status", "status_cmd"),
    "serve": ("kcops.cli.serve", "serve_cmd"),
    "kc": ("kcops.cli.kc", "kc_group"),
    "alerts": ("kcops.cli.alerts", "alerts_group"),
    "actions": ("kcops.cli.actions", "actions_group"),
    "demo": ("kcops.cli.demo", "demo_cmd"),
    "runbook": ("kcops.cli.runbook", "runbook_cmd"),
    "diagnose": ("kcops.cli.diagnose", "diagnose_cmd"),
    "top": ("kcops.cli.top", "top_cmd"),
    "load": ("kcops.cli.load.cmd", "load_cmd"),
    "report": ("kcops.cli.report.cmd", "report_cmd"),
    "cost": ("kcops.cli.cost", "cost_cmd"),
    "dashboards": ("kcops.cli.dashboards", "dashboards_group"),
}


class LazyGroup(click.Group):
    """A group whose subcommands in :data:`COMMANDS` are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            module, attr = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attr)
            if command.name != cmd_name:  # a renamed command must not hide behind the table
                raise RuntimeError(f"{module}.{attr} is named {command.name!r}, not {cmd_name!r}")
            self.add_command(command)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, help="kcops: sidecar agent for LLM inference serving.")
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
