from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.records import parse_record
from kcops.cli import cli
from kcops.cli.actions import parse_params, parse_since

T0 = 1_796_043_700.0


def seed(state: Path) -> None:
    log = AuditLog(state / "audit.jsonl")
    log.append(parse_record({
        "kind": "ladder", "ts": T0, "event": "started", "alertname": "KcopsOOM", "step": 0,
        "steps": ["lower_topn"],
    }))  # fmt: skip
    log.append(parse_record({
        "kind": "action", "ts": T0 + 1, "action": "lower_topn", "outcome": "ok",
        "mode": "enforce", "duration_s": 0.05, "detail": "top_n 64 -> 48",
        "ladder": {"alertname": "KcopsOOM", "step": 0},
    }))  # fmt: skip
    log.close()
    with open(state / "audit.jsonl", "a") as fh:
        fh.write('{"kind": "action", "ts": 1')  # a torn last line is skipped


def test_history_from_state_dir(tmp_path: Path) -> None:
    seed(tmp_path)
    res = CliRunner().invoke(cli, ["actions", "history", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "ladder KcopsOOM: started" in res.output
    assert "lower_topn" in res.output and "top_n 64 -> 48" in res.output
    res = CliRunner().invoke(
        cli, ["actions", "history", "--state-dir", str(tmp_path), "--json", "--since", str(T0 + 1)]
    )
    lines = [json.loads(x) for x in res.output.splitlines()]
    assert [x["action"] for x in lines] == ["lower_topn"]


def test_unreachable_agent_exits_3() -> None:
    res = CliRunner().invoke(cli, ["actions", "list", "--agent", "http://127.0.0.1:9"])
    assert res.exit_code == 3


def test_param_and_since_parsing() -> None:
    assert parse_params(("policy=lru", "fraction=0.25", "engine=false")) == {
        "policy": "lru",
        "fraction": 0.25,
        "engine": False,
    }
    assert parse_since("30m", now=T0) == T0 - 1800
    assert parse_since("2026-11-30T13:01:40Z") == T0
    assert parse_since(None) is None
