"""``kcops alerts``: list, show, export, check and replay the alert rules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import yaml

from kcops.cli.common import (
    EXIT_FAILURE,
    agent_get_json,
    agent_option,
    echo_json,
    handle_errors,
    one_line,
    parse_params,
)
from kcops.cli.timefmt import as_float, when
from kcops.errors import ConfigError

if TYPE_CHECKING:
    from kcops.agent.rules.loader import RuleSet


# A rule that reads the engine's ready state holds itself quiet while the engine warms up
# (alerts/rules.yaml: the forecast, the latency and hit-rate rules).
WARM_UP = 'kcops_engine_state{state="ready"}'


def load_ruleset(rules: str | None, params: tuple[str, ...] = ()) -> RuleSet:
    """The rule file of ``--rules`` (default: the packaged table) with ``--param`` overrides,
    its ladder steps checked against the agent's actions."""
    from kcops.agent.actions.registry import builtin_actions
    from kcops.agent.rules.loader import DEFAULT_VERIFY_S, default_rules_path, load_rules

    actions = builtin_actions().ladder_params()
    path = rules or default_rules_path()
    return load_rules(path, parse_params(params), DEFAULT_VERIFY_S, actions)


rules_option = click.option(
    "--rules",
    "rules_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Rule file (default: the packaged alerts/rules.yaml).",
)
param_option = click.option(
    "--param", "params", multiple=True, metavar="NAME=VALUE", help="Override a rule parameter."
)


@click.group("alerts", help="The alert rules: live state, export for Prometheus, replay tests.")
def alerts_group() -> None:
    pass


@alerts_group.command("list", help="Active alerts of a running agent, or the rules of a file.")
@agent_option
@click.option(
    "--file",
    "rules_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="List the rules of this file instead of asking the agent.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def list_cmd(agent_url: str, rules_file: str | None, as_json: bool) -> None:
    if rules_file is not None:
        rs = load_ruleset(rules_file)
        rows = [
            {
                "name": r.name,
                "type": r.kind,
                "for": r.raw.get("for", ""),
                "severity": r.raw.get("labels", {}).get("severity", ""),
                "guard": "warm-up" if WARM_UP in str(r.raw.get("expr", "")) else "",
            }
            for r in rs.rules
        ]
        if as_json:
            echo_json(rows)
            return
        for row in rows:
            guard = " quiet while the engine warms up" if row["guard"] else ""
            line = f"{row['name']:<30} {row['type']:<9} for={row['for']:<5} {row['severity']:<7}"
            click.echo((line + guard).rstrip())
        return
    alerts = agent_get_json(agent_url, "/api/v1/alerts")
    if as_json:
        echo_json(alerts)
        return
    active = alerts.get("alerts", [])
    if not active:
        click.echo("no active alerts")
    for a in active:
        labels = ",".join(f"{k}={v}" for k, v in sorted(a["labels"].items()) if k != "alertname")
        since = a.get("fired_at") if a["state"] == "firing" else a.get("active_since")
        by = f" (inhibited by {a['inhibited_by']})" if a.get("inhibited_by") else ""
        line = f"{a['alertname']:<30} {a['state']:<8} since {when(as_float(since))} {labels}{by}"
        click.echo(one_line(line))


@alerts_group.command("show", help="One rule: expression, for, labels, annotations, remediation.")
@click.argument("name")
@rules_option
@param_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def show_cmd(name: str, rules_file: str | None, params: tuple[str, ...], as_json: bool) -> None:
    rs = load_ruleset(rules_file, params)
    rule = rs.get(name)
    if rule is None:
        names = ", ".join(r.name for r in rs.rules)
        click.echo(f"error: no rule {name!r}; rules: {names}", err=True)
        sys.exit(EXIT_FAILURE)
    doc = dict(rule.raw)
    from kcops.agent.rules.loader import AlertRule

    if isinstance(rule, AlertRule) and rule.remediation:
        doc["remediation"] = [
            {"action": s.action.value, "params": dict(s.params), "verify_s": s.verify_s}
            for s in rule.remediation
        ]
    if as_json:
        echo_json(doc)
        return
    click.echo(yaml.safe_dump(doc, sort_keys=False, width=1000), nl=False)


@alerts_group.command("export", help="Write the rules for Prometheus (kcops extensions removed).")
@rules_option
@param_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["prometheus", "prometheusrule", "prometheus-operator"]),
    default="prometheus",
    show_default=True,
    help="A rule file, or a Prometheus Operator PrometheusRule (prometheus-operator: alias).",
)
@click.option("--name", default="kcops", show_default=True, help="PrometheusRule name.")
@click.option("--namespace", default=None, help="PrometheusRule namespace.")
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="KEY=VALUE label of the PrometheusRule (repeat), e.g. release=kube-prometheus-stack.",
)
@click.option(
    "--records/--no-records",
    default=True,
    show_default=True,
    help="Append the fleet's recording rules (alerts/records.yaml: cost, effective context "
    "and K(C) by layer over every pod), for the Prometheus that scrapes the sidecars.",
)
@handle_errors
def export_cmd(
    rules_file: str | None,
    params: tuple[str, ...],
    fmt: str,
    name: str,
    namespace: str | None,
    labels: tuple[str, ...],
    records: bool,
) -> None:
    from kcops.agent.rules.export import OPERATOR, export_rules
    from kcops.alerts import packaged_file

    extra: dict[str, str] = {}
    for pair in labels:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--label {pair!r}: expected KEY=VALUE")
        extra[key] = value
    click.echo(
        export_rules(
            load_ruleset(rules_file, params),
            OPERATOR if fmt == "prometheusrule" else fmt,
            name=name,
            namespace=namespace,
            labels={"app.kubernetes.io/name": "kcops", **extra},
            records=load_ruleset(str(packaged_file("records.yaml"))) if records else None,
        ),
        nl=False,
    )


@alerts_group.command("check", help="Parse a rule file and check it against kcops's PromQL subset.")
@click.argument("file", type=click.Path(dir_okay=False))
@param_option
@click.option("--json", "as_json", is_flag=True, help="Print the rules found as JSON.")
@handle_errors
def check_cmd(file: str, params: tuple[str, ...], as_json: bool) -> None:
    rs = load_ruleset(file, params)
    if as_json:
        rules = [{"name": r.name, "type": r.kind, "group": r.group} for r in rs.rules]
        echo_json({"file": file, "ok": True, "params": dict(rs.params), "rules": rules})
        return
    click.echo(f"{file}: OK, {len(rs.rules)} rules ({len(rs.alerts())} alerting)")


@alerts_group.command(
    "replay", help="Replay a `promtool test rules` file; print alert state changes as JSON lines."
)
@click.argument("testfile", type=click.Path(dir_okay=False))
@rules_option
@param_option
@click.option(
    "--assert",
    "check",
    is_flag=True,
    help="Also check the file's alert_rule_test expectations, like promtool.",
)
@handle_errors
def replay_cmd(testfile: str, rules_file: str | None, params: tuple[str, ...], check: bool) -> None:
    from kcops.agent.rules.promtest import load_test_file, replay_group, resolve_rules

    test = load_test_file(testfile)
    overrides = parse_params(params)
    ruleset = resolve_rules(test, rules_file, overrides)
    failures: list[str] = []
    multi = len(test.groups) > 1
    for group in test.groups:
        group_failures = []
        for tr, failure in replay_group(ruleset, group, test.evaluation_interval_s, check=check):
            if tr is not None:
                line: dict[str, object] = {
                    "t": int(tr.t) if float(tr.t).is_integer() else tr.t,
                    "alertname": tr.alertname,
                    "labels": dict(tr.labels),
                    "state": tr.state,
                }
                if multi:
                    line["test"] = group.name
                click.echo(json.dumps(line, sort_keys=False))
            elif failure is not None and failure not in group_failures:
                group_failures.append(failure)
        if group_failures:
            failures.append(f"  FAILED: {group.name}\n" + "\n".join(group_failures))
    if check:
        if failures:
            click.echo(f"{Path(testfile)}: FAILED:", err=True)
            for f in failures:
                click.echo(f, err=True)
            sys.exit(EXIT_FAILURE)
        click.echo(f"{Path(testfile)}: SUCCESS", err=True)
