"""``kcops actions list|run|history``: remediation from the command line."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import click
from pydantic import JsonValue

from kcops.agent.remediation.records import (
    ActionRecord,
    AlertRecord,
    AuditRecord,
    EscalationRecord,
    LadderRecord,
    PageRecord,
    RepeatedRecord,
    StartedRecord,
    parse_record,
)
from kcops.cli.common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    agent_get_json,
    agent_option,
    agent_request,
    echo_json,
    handle_errors,
    one_line,
    parse_params,
    token_headers,
)
from kcops.cli.timefmt import as_float, when


def parse_since(value: str | None, now: float | None = None) -> float | None:
    """``30m``/``2h``/``1d`` ago, an ISO time, or Unix seconds."""
    if not value:
        return None
    from kcops.agent.duration import parse_duration

    now = time.time() if now is None else now
    try:
        return now - parse_duration(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: use a duration (30m, 2h), an ISO time or Unix seconds",
            param_hint="--since",
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def past_window(since: str) -> tuple[float, float]:
    """``(start, end)`` in Unix seconds: from ``--since`` (:func:`parse_since`) to now."""
    end = time.time()
    start = parse_since(since, end)
    if start is None or start >= end:
        raise click.BadParameter(f"{since!r} is not in the past", param_hint="--since")
    return start, end


def _when(ts: float) -> str:
    """Local ISO time and how long ago, e.g. ``2026-12-01T03:04:05+01:00 (3m ago)``."""
    t = as_float(ts)
    return "?" if t is None or t <= 0 else when(t)


def format_record(r: AuditRecord) -> str:
    """One line of ``kcops actions history`` for a record, by its kind: printable, whatever
    the alert's labels or an engine's answer held."""
    return one_line(_record_line(r))


def _record_line(r: AuditRecord) -> str:
    when = _when(r.ts)
    if isinstance(r, ActionRecord):
        alert = (r.ladder.alertname if r.ladder else None) or (
            r.trigger.source if r.trigger else None
        )
        line = (
            f"{when}  {r.action or '?':<17} {r.outcome or '?':<17} "
            f"{r.mode:<8} {r.duration_s:6.2f}s  {alert or ''}"
        )
        if r.error:
            line += f"  error: {r.error}"
        elif r.detail:
            line += f"  {r.detail}"
        return line
    if isinstance(r, StartedRecord):
        alert = (r.ladder.alertname if r.ladder else None) or (
            r.trigger.source if r.trigger else None
        )
        return f"{when}  {r.action:<17} {'started':<17} {r.mode:<8} {'':>7}  {alert or ''}"
    if isinstance(r, RepeatedRecord):
        of = r.of
        what = " ".join(str(of[k]) for k in ("action", "outcome", "alertname") if of.get(k))
        span = max(0.0, r.last_ts - r.first_ts)
        return f"{when}  repeated {r.count} more time(s) over {span:.0f}s ({r.why}): {what}" + (
            f"  last error: {r.error}" if r.error else ""
        )
    if isinstance(r, LadderRecord):
        return (
            f"{when}  ladder {r.alertname}: {r.event} (step {r.step + 1}/{len(r.steps)})"
            + (f" {r.why}" if r.why else "")
            + (f" skipped: {'; '.join(r.skipped)}" if r.skipped else "")
        )
    if isinstance(r, PageRecord):
        return f"{when}  PAGE  {r.message}"
    if isinstance(r, AlertRecord):
        return f"{when}  alert {r.trigger.alertname} ({r.trigger.source}): {r.event} — {r.detail}"
    if isinstance(r, EscalationRecord):
        return f"{when}  ESCALATION ({r.severity}) {r.alertname}: {r.message}"
    # A kind this CLI does not know yet: its fields as JSON, times made readable.
    rest = {k: v for k, v in r.as_json().items() if k != "ts"}
    return f"{when}  {json.dumps(readable_times(rest), default=str)}"


TIME_KEYS = ("ts", "t", "at", "since", "until", "started", "ended")


def _is_time_key(key: str) -> bool:
    return key in TIME_KEYS or key.endswith(("_ts", "_at", "_since", "_until"))


def readable_times(value: JsonValue, key: str = "") -> JsonValue:
    """``value`` with every number under a time-like key as local ISO time and "ago"."""
    if isinstance(value, dict):
        return {k: readable_times(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [readable_times(v, key) for v in value]
    if _is_time_key(key):
        t = as_float(value)
        if t is not None and t > 0:
            return when(t)
    return value


@click.group("actions", help="Remediation actions: list them, run one, read the audit log.")
def actions_group() -> None:
    pass


@actions_group.command("list", help="Actions the agent knows, its mode and guard state.")
@agent_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def list_cmd(agent_url: str, as_json: bool) -> None:
    data = agent_get_json(agent_url, "/api/v1/actions")
    if as_json:
        echo_json(data)
        return
    click.echo(f"mode: {data.get('mode')}")
    for a in data.get("actions", []):
        props = (a.get("params") or {}).get("properties") or {}
        params = " ".join(f"{k}=" for k in props)
        click.echo(f"  {a['name']:<17} {a.get('help', '')}" + (f"  [{params}]" if params else ""))
    g = data.get("guards") or {}
    click.echo(
        f"runs in the last hour: {g.get('runs_last_hour')}/{g.get('budget_per_hour')}; "
        f"breakers open: {', '.join(g.get('breakers_open') or []) or 'none'}"
    )


@actions_group.command("run", help="Run one action through the agent's guards.")
@click.argument("name")
@click.option("--param", "params", multiple=True, metavar="K=V", help="Action parameter.")
@click.option("--dry-run", is_flag=True, help="Decide and log, change nothing.")
@click.option("--force", is_flag=True, help="Skip cooldown and budget (needs --reason).")
@click.option("--reason", help="Why; recorded in the audit log. Required with --force.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="Bearer token file.")
@click.option("--json", "as_json", is_flag=True, help="Print the audit record as JSON.")
@agent_option
@handle_errors
def run_cmd(
    name: str,
    params: tuple[str, ...],
    dry_run: bool,
    force: bool,
    reason: str | None,
    token_file: str | None,
    as_json: bool,
    agent_url: str,
) -> None:
    if force and not reason:
        raise click.UsageError("--force needs --reason")
    body = {"params": parse_params(params), "dry_run": dry_run, "force": force, "reason": reason}
    resp = agent_request(
        "POST",
        agent_url,
        f"/api/v1/actions/{name}",
        json_body=body,
        headers=token_headers(token_file),
        timeout_s=180.0,
    )
    try:
        data = resp.json()
    except ValueError:
        data = {"error": resp.text[:300]}
    if resp.status_code == 401:
        click.echo(f"error: unauthorized: {data.get('detail', '')}", err=True)
        sys.exit(EXIT_FAILURE)
    if resp.status_code in (404, 422, 400):
        click.echo(f"error: {data.get('error') or data.get('error')}", err=True)
        if data.get("allowed"):
            click.echo(f"known actions: {', '.join(data['allowed'])}", err=True)
        sys.exit(EXIT_USAGE)
    if as_json:
        echo_json(data)
    else:
        click.echo(format_record(parse_record(data)))
    sys.exit(EXIT_OK if data.get("outcome") in ("ok", "dry_run") else EXIT_FAILURE)


@actions_group.command("history", help="The audit log: what ran, why, and what changed.")
@click.option("--since", help="30m, 2h, 1d, an ISO time or Unix seconds.")
@click.option("--json", "as_json", is_flag=True, help="JSON lines, as stored.")
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False),
    help="Read audit.jsonl from this state dir instead of asking the agent.",
)
@agent_option
@handle_errors
def history_cmd(since: str | None, as_json: bool, state_dir: str | None, agent_url: str) -> None:
    since_ts = parse_since(since)
    records: list[AuditRecord]
    if state_dir:
        from kcops.agent.remediation.auditread import read_records

        path = Path(state_dir) / "audit.jsonl"
        if not path.exists():
            click.echo(f"error: no audit log at {path}", err=True)
            sys.exit(EXIT_FAILURE)
        records = list(read_records(path, since_ts))
    else:
        query = f"?since={since_ts}" if since_ts is not None else ""
        raw = agent_get_json(agent_url, f"/api/v1/actions/history{query}")["records"]
        records = [parse_record(r) for r in raw if isinstance(r, dict)]
    for r in records:
        click.echo(
            json.dumps(r.as_json(), sort_keys=True, default=str) if as_json else format_record(r)
        )
