"""Click groups whose commands are imported only when used, some from other distributions.

A command's module is imported when that command runs (or ``--help`` lists them): ``kcops
agent run`` then carries the agent's imports alone, not those of every other command, which
keeps the idle sidecar's RSS down. The lab (``kc sweep`` and its kin, distribution
``kcops-lab``) and the demo (``demo``, ``load``, ``kcops-demo``) are not part of the sidecar's
install: their commands are listed here by name and module, and where that module is absent
the command says which distribution brings it instead of "No such command".
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Mapping

import click

# Where each optional part comes from: the import-name prefix, and what to install.
OPTIONAL = {
    "kcops.lab.": "kcops-lab (`pip install ./lab` from a checkout)",
    "kcops.demo.": "kcops-demo (`pip install ./demo` from a checkout)",
}


def _missing(module: str) -> str | None:
    """What to install for ``module`` when it is an optional part that is not here."""
    for prefix, dist in OPTIONAL.items():
        if module.startswith(prefix):
            try:
                found = importlib.util.find_spec(prefix.rstrip(".")) is not None
            except ModuleNotFoundError:
                found = False
            return None if found else dist
    return None


class LazyGroup(click.Group):
    """A group whose subcommands in ``lazy`` (name -> (module, attribute)) are imported on
    first use."""

    def __init__(
        self, *args: object, lazy: Mapping[str, tuple[str, str]] | None = None, **kw: object
    ) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        here = {n for n, (module, _) in self.lazy.items() if _missing(module) is None}
        return sorted({*super().list_commands(ctx), *here})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, attr = self.lazy[cmd_name]
            dist = _missing(module)
            if dist is not None:
                where = f"{ctx.command_path} {cmd_name}"
                raise click.UsageError(f"`{where}` is not installed here: it comes with {dist}")
            command = getattr(importlib.import_module(module), attr)
            if command.name != cmd_name:  # a renamed command must not hide behind the table
                raise RuntimeError(f"{module}.{attr} is named {command.name!r}, not {cmd_name!r}")
            self.add_command(command)
        return super().get_command(ctx, cmd_name)
