"""The generated references (docs/reference/): current with the code, and missing no
configuration key and no command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kcops.agent.config import Config
from kcops.cli import cli
from kcops.cli.docs_export import CLI_MD, CONFIG_MD, cli_reference, config_reference

REPO = Path(__file__).resolve().parents[3]


def test_committed_references_are_what_the_code_generates() -> None:
    for rel, (text, _names) in ((CONFIG_MD, config_reference()), (CLI_MD, cli_reference())):
        assert (REPO / rel).read_text(encoding="utf-8") == text, (
            f"{rel} is stale: run `python -m kcops.cli.docs_export --root .` (make docs)"
        )


def _leaves(doc: dict[str, Any], prefix: str = "") -> list[str]:
    """Every key path of the default configuration: a section (a non-empty mapping) is
    walked; anything else, an empty mapping of the user's own names included, is a key."""
    out = []
    for k, v in doc.items():
        path = f"{prefix}.{k}" if prefix else k
        out += _leaves(v, path) if isinstance(v, dict) and v else [path]
    return out


def test_every_configuration_key_is_in_the_reference() -> None:
    text, keys = config_reference()
    for path in _leaves(Config().model_dump(mode="json")):
        section, _, key = path.rpartition(".")
        assert path in keys, f"configuration key {path} missing from {CONFIG_MD}"
        assert f"## `{section}`" in text and f"| `{key}` |" in text, path
    described = [line for line in text.splitlines() if line.startswith("| `")]
    assert all(not line.rstrip().endswith("|  |") for line in described), [
        line.split("|")[1] for line in described if line.rstrip().endswith("|  |")
    ]  # every key says what it is


def _paths(group: click.Group, ctx: click.Context, prefix: str) -> list[str]:
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, name
        out.append(f"{prefix} {name}")
        if isinstance(cmd, click.Group):
            out += _paths(cmd, click.Context(cmd, info_name=name, parent=ctx), f"{prefix} {name}")
    return out


def test_every_command_is_in_the_reference() -> None:
    text, _ = cli_reference()
    paths = _paths(cli, click.Context(cli, info_name="kcops"), "kcops")
    assert {"kcops cost", "kcops kc recommend", "kcops agent run", "kcops alerts"} <= set(paths)
    for path in paths:
        assert f"`{path}`\n" in text, f"command {path} missing from {CLI_MD}"
