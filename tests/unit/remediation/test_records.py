"""Audit records: one model per kind, written by the agent, read back by the CLI."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.auditread import read_audit, read_records
from kcops.agent.remediation.records import (
    ActionRecord,
    LadderRecord,
    LadderRef,
    OtherRecord,
    PageRecord,
    Trigger,
    parse_record,
)
from kcops.cli import cli

T0 = 1_796_043_700.0


def test_a_record_keeps_only_the_fields_it_was_given(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    log.append(
        LadderRecord(
            ts=T0,
            event="started",
            alertname="A",
            steps=["notify"],
            trigger=Trigger(alertname="A", source="local", value=None),
        )
    )
    log.append(PageRecord(ts=T0 + 1, message="paged", alertname="A"))
    log.close()
    raw = list(read_audit(tmp_path / "audit.jsonl"))
    assert raw[0] == {
        "kind": "ladder",
        "ts": T0,
        "event": "started",
        "alertname": "A",
        "steps": ["notify"],
        "trigger": {"alertname": "A", "source": "local", "value": None},
    }
    assert raw[1] == {"kind": "page", "ts": T0 + 1, "message": "paged", "alertname": "A"}
    got = list(read_records(tmp_path / "audit.jsonl"))
    assert isinstance(got[0], LadderRecord) and got[0].trigger.alertname == "A"
    assert isinstance(got[1], PageRecord) and got[1].alertname == "A"


def test_records_of_older_agents_and_unknown_kinds_still_read() -> None:
    old = parse_record(
        {
            "kind": "action",
            "ts": T0,
            "action": "lower_topn",
            "outcome": "ok",
            "ladder": {"alertname": "KcopsOOM", "step": 0},
        }
    )
    assert isinstance(old, ActionRecord) and old.ladder == LadderRef(alertname="KcopsOOM", step=0)
    future = parse_record({"kind": "future", "ts": T0, "x": {"y": 1}})
    assert isinstance(future, OtherRecord) and future.as_json()["kind"] == "future"
    assert future.as_json() == {"kind": "future", "ts": T0, "x": {"y": 1}}
    # A known kind whose fields do not fit is kept whole, not dropped.
    odd = parse_record({"kind": "page", "ts": T0, "message": ["not", "text"]})
    assert isinstance(odd, OtherRecord) and odd.as_json()["kind"] == "page"


def test_the_cli_prints_what_the_agent_wrote(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    rec = ActionRecord(
        ts=T0,
        run_id="x-1",
        action="notify",
        outcome="refused",
        mode="enforce",
        error="actions.notify.url is not configured",
        refusal="not_configured",
        trigger=Trigger(source="api", remote="127.0.0.1"),
    )
    log.append(rec)
    log.close()
    res = CliRunner().invoke(cli, ["actions", "history", "--state-dir", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert parse_record(json.loads(res.output)) == rec
    res = CliRunner().invoke(cli, ["actions", "history", "--state-dir", str(tmp_path)])
    assert "notify" in res.output and "error: actions.notify.url is not configured" in res.output
