"""``kcops top``: a live terminal view of one agent (see :mod:`topapp`).

``--once`` prints one frame and exits, for a quick look over SSH; with
``--json`` that frame's data, for scripts (no TUI library needed). The views
need the ``tui`` extra (textual and rich), kept out of the sidecar's install.
"""

from __future__ import annotations

import shutil

import click

from kcops.cli.common import FiniteFloat, agent_option, echo_json, handle_errors, token_headers
from kcops.cli.topdata import AgentClient, snapshot
from kcops.cli.topdata import as_json as as_json_frame
from kcops.errors import ConfigError


def _need_tui() -> None:
    try:
        import rich  # noqa: F401
        import textual  # noqa: F401
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"kcops top needs {exc.name}: pip install 'kcops[tui]' (not in the sidecar's install)"
        ) from None


@click.command("top", help="Live view of an agent: serving, memory, K(C), alerts, actions.")
@agent_option
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option("--refresh", "refresh_s", default=2.0, show_default=True, type=FiniteFloat(0.2, 60))
@click.option("--token-file", type=click.Path(dir_okay=False), help="Bearer token for actions.")
@click.option("--width", type=click.IntRange(40, 400), help="Columns for --once (default: tty).")
@click.option("--json", "as_json", is_flag=True, help="With --once: the frame's data as JSON.")
@handle_errors
def top_cmd(
    agent_url: str,
    once: bool,
    refresh_s: float,
    token_file: str | None,
    width: int | None,
    as_json: bool,
) -> None:
    if as_json and not once:
        raise click.UsageError("--json prints one frame: use it with --once")
    client = AgentClient(agent_url)
    if as_json:
        try:
            echo_json(as_json_frame(snapshot(client, with_history=True)))
        finally:
            client.close()
        return
    _need_tui()
    from rich.console import Console

    from kcops.cli.topview import frame

    try:
        if once:
            cols = width or min(shutil.get_terminal_size((80, 24)).columns, 120)
            console = Console(width=cols, highlight=False, soft_wrap=False)
            console.print(frame(snapshot(client, with_history=True)))
            return
        from kcops.cli.topapp import TopApp

        token_headers(token_file)  # a bad --token-file is a usage error before the screen opens
        TopApp(client, lambda: token_headers(token_file), refresh_s).run()
    finally:
        client.close()
