"""``kcops dashboards build|push``: the Grafana dashboards, from code."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kcops.cli.alerts import load_ruleset, param_option, rules_option
from kcops.cli.common import EXIT_FAILURE, EXIT_UNREACHABLE, handle_errors

if TYPE_CHECKING:
    from kcops.agent.rules.loader import RuleSet


@click.group("dashboards", help="Build the Grafana dashboards, or push them to a Grafana.")
def dashboards_group() -> None:
    pass


@dashboards_group.command("build", help="Write the dashboards' JSON (one file per dashboard).")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="dashboards/generated",
    show_default=True,
    help="Folder to write to.",
)
@rules_option
@param_option
@handle_errors
def build_cmd(out: str, rules_file: str | None, params: tuple[str, ...]) -> None:
    """Thresholds follow the rule set: `--param device_memory_ratio=0.85` moves the line."""
    files = dashboard_files(load_ruleset(rules_file, params))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name).write_text(text)
        click.echo(f"wrote {folder / name} ({len(json.loads(text)['panels'])} panels)")


def dashboard_files(ruleset: RuleSet | None = None) -> dict[str, str]:
    """File name -> the exact text ``dashboards build`` writes (the ConfigMaps reuse it)."""
    from kcops.dashboards.build import build_all

    return {
        name: json.dumps(model, indent=2, sort_keys=True) + "\n"
        for name, model in build_all(ruleset).items()
    }


# kube-prometheus-stack's Grafana sidecar loads every ConfigMap carrying this label.
SIDECAR_LABEL = "grafana_dashboard"


@dashboards_group.command(
    "export",
    help="Write the dashboards as Kubernetes ConfigMaps labelled for the Grafana sidecar "
    "(one YAML stream on stdout).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["configmap"]), default="configmap", show_default=True
)
@click.option("--namespace", default=None, help="Namespace of the ConfigMaps (default: none).")
@click.option(
    "--label",
    default=f"{SIDECAR_LABEL}=1",
    show_default=True,
    help="KEY=VALUE label the Grafana sidecar selects on.",
)
@click.option("--folder", default="kcops", show_default=True, help="Grafana folder annotation.")
@rules_option
@param_option
@handle_errors
def export_cmd(
    fmt: str,
    namespace: str | None,
    label: str,
    folder: str,
    rules_file: str | None,
    params: tuple[str, ...],
) -> None:
    from kcops.cli.deploy_export import dashboard_configmaps

    key, sep, value = label.partition("=")
    if not sep or not key:
        click.echo(f"error: --label {label!r}: expected KEY=VALUE", err=True)
        sys.exit(2)
    click.echo(
        dashboard_configmaps(
            dashboard_files(load_ruleset(rules_file, params)), namespace, {key: value}, folder
        ),
        nl=False,
    )


@dashboards_group.command(
    "push",
    help="Upload the dashboards to Grafana (POST /api/dashboards/db, overwrite). "
    "The API token comes from $GRAFANA_TOKEN or --token-file.",
)
@click.option("--grafana-url", required=True, help="Grafana base URL, e.g. http://grafana:3000.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="File with a Grafana token.")
@click.option("--folder-uid", default=None, help="Grafana folder UID to put them in.")
@rules_option
@param_option
@handle_errors
def push_cmd(
    grafana_url: str,
    token_file: str | None,
    folder_uid: str | None,
    rules_file: str | None,
    params: tuple[str, ...],
) -> None:
    from grafana_client import GrafanaApi
    from grafana_client.client import GrafanaClientError

    from kcops.auth import check_token, read_token_file
    from kcops.dashboards.build import build_all

    # One token reader (kcops.auth): not UTF-8, unreadable or empty is one line, exit 2.
    token = os.environ.get("GRAFANA_TOKEN", "").strip()
    if token_file:
        token = read_token_file(Path(token_file))
    elif token:
        token = check_token(token, "GRAFANA_TOKEN")
    if not token:
        click.echo("error: no Grafana token: set $GRAFANA_TOKEN or --token-file", err=True)
        sys.exit(2)
    models = build_all(load_ruleset(rules_file, params))
    api = GrafanaApi.from_url(grafana_url, credential=token, timeout=10.0)
    failed = False
    for name, model in models.items():
        body: dict[str, object] = {
            "dashboard": model,
            "overwrite": True,
            "message": "kcops dashboards push",
        }
        if folder_uid:
            body["folderUid"] = folder_uid
        try:
            res = api.dashboard.update_dashboard(body)
        except GrafanaClientError as exc:
            click.echo(f"{name}: refused by Grafana: {exc}", err=True)
            failed = True
            continue
        except Exception as exc:  # connection errors come from the HTTP library underneath
            click.echo(f"error: cannot reach Grafana at {grafana_url}: {exc}", err=True)
            sys.exit(EXIT_UNREACHABLE)
        click.echo(f"{name}: {res.get('status', 'ok')} {res.get('url', '')}")
    if failed:
        sys.exit(EXIT_FAILURE)
