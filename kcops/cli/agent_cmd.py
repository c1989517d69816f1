"""``kcops agent run`` and ``kcops agent check-config``."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

import click

from kcops.agent.config import Config, load_config, parse_config
from kcops.agent.engine.kinds import builtin_kinds
from kcops.cli.common import EXIT_USAGE, DurationParam, echo_json, handle_errors
from kcops.errors import ConfigError

# auto and every engine kind the registry knows.
ADAPTERS = list(builtin_kinds().choices())


def apply_overrides(cfg: Config, overrides: dict[str, object]) -> Config:
    """Flags override the file; the result is validated like the file was."""
    data = cfg.model_dump(mode="json")
    for dotted, value in overrides.items():
        if value is None:
            continue
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return parse_config(data, "<flags>")


@click.group("agent", help="Run the sidecar agent, or check its configuration.")
def agent_group() -> None:
    pass


F = TypeVar("F", bound=Callable[..., object])

# The flags that shape the configuration: `agent run` and `agent check-config` take the
# same ones, apply them the same way (config_from_flags) and check the result with the
# same function (kcops.agent.preflight), so check-config says ok exactly when run starts.
_FLAGS = [
    click.option("--listen", help="HOST:PORT for the control API and /metrics [127.0.0.1:9464]."),
    click.option(
        "--state-dir", type=click.Path(file_okay=False), help="Audit log and guard state."
    ),
    click.option("--rules", "rules_file", type=click.Path(dir_okay=False), help="Rule file."),
    click.option(
        "--mode", type=click.Choice(["enforce", "dry-run", "off"]), help="Remediation mode."
    ),
    click.option("--engine-url", help="Engine base URL, e.g. http://127.0.0.1:8000."),
    click.option("--engine-adapter", type=click.Choice(ADAPTERS), help="Engine metrics dialect."),
    click.option(
        "--tick", "tick_s", type=DurationParam(), help="Time between ticks: 1.5, 500ms, 2s [1s]."
    ),
    click.option("--token-file", type=click.Path(dir_okay=False), help="Bearer token file."),
    click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"])),
]


def config_flags(fn: F) -> F:
    for option in reversed(_FLAGS):
        fn = option(fn)
    return fn


def config_from_flags(
    config_path: str | None, flags: dict[str, object], engine_cmd: tuple[str, ...] = ()
) -> Config:
    """The config file (none: the defaults) with the flags applied, validated."""
    return apply_overrides(
        load_config(config_path),
        {
            "agent.listen": flags.get("listen"),
            "agent.state_dir": flags.get("state_dir"),
            "agent.tick_s": flags.get("tick_s"),
            "agent.token_file": flags.get("token_file"),
            "agent.log_level": flags.get("log_level"),
            "rules.file": flags.get("rules_file"),
            "actions.mode": flags.get("mode"),
            "engine.url": flags.get("engine_url"),
            "engine.adapter": flags.get("engine_adapter"),
            "engine.command": list(engine_cmd) if engine_cmd else None,
        },
    )


@agent_group.command(
    "run",
    context_settings={"allow_interspersed_args": False},
    help="Run the agent daemon. Flags override the config file. "
    "Anything after `--` is an engine command the agent launches and supervises.",
)
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML config file.")
@config_flags
@click.argument("engine_cmd", nargs=-1, type=click.UNPROCESSED)
@handle_errors
def run_cmd(config_path: str | None, engine_cmd: tuple[str, ...], **flags: object) -> None:
    from kcops.agent.app import Agent

    cfg = config_from_flags(config_path, flags, engine_cmd)
    logging.basicConfig(
        level=cfg.agent.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # httpx logs every request at INFO: two lines per engine scrape, every tick.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.root.level))
    agent = Agent(cfg)
    asyncio.run(agent.run())


@agent_group.command(
    "check-config",
    help="Validate a config file without starting the agent: the checks `agent run` makes "
    "before it starts (the file, the token, the listen address, the rule file), with "
    "the same flags.",
)
@click.argument("path", type=click.Path(dir_okay=False))
@config_flags
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and the config as JSON.")
def check_config(path: str, as_json: bool, **flags: object) -> None:
    from kcops.agent.preflight import preflight

    try:
        cfg = config_from_flags(path, flags)
        checked = preflight(cfg)
    except ConfigError as exc:
        if as_json:
            echo_json({"path": path, "ok": False, "error": str(exc)})
        else:
            click.echo(f"error: {exc}", err=True)  # word for word what `agent run` prints
        sys.exit(EXIT_USAGE)
    found = checked.warnings
    if as_json:
        echo_json(
            {"path": path, "ok": True, "warnings": found, "config": cfg.model_dump(mode="json")}
        )
        return
    for w in found:
        click.echo(f"warning: {w}", err=True)
    rules = checked.ruleset
    loaded = f", {len(rules.rules)} rules" if rules is not None else ""
    click.echo(f"{path}: ok (listen {cfg.agent.listen}, tick {cfg.agent.tick_s}s{loaded})")


@agent_group.command(
    "default-config", help="Print the full default configuration as YAML (every key, annotated)."
)
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON (no annotations).")
def default_config(as_json: bool) -> None:
    import yaml

    cfg = Config()
    if as_json:
        echo_json(cfg.model_dump(mode="json"))
        return
    click.echo("# kcops agent configuration: every key with its default.")
    click.echo("# Validate an edited copy with `kcops agent check-config FILE`.")
    click.echo(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), nl=False)
