"""Rule groups in a real `kcops agent run`: a group's own interval, and alert `for` state
restored after the agent is killed mid-`for` (Prometheus's ALERTS_FOR_STATE)."""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.services import free_port, kcops_bin, running, wait_http, wait_until

pytestmark = pytest.mark.slow  # real agent processes, ~30 s of alert time


def _agent_cmd(tmp_path: Path, port: int, rules: dict[str, object]) -> list[str]:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    return [
        kcops_bin(), "agent", "run", "--listen", f"127.0.0.1:{port}",
        "--state-dir", str(tmp_path / "state"), "--rules", str(tmp_path / "rules.yaml"),
        "--tick", "1s",
    ]  # fmt: skip


def _alert(base: str, name: str) -> dict[str, object] | None:
    doc = httpx.get(f"{base}/api/v1/alerts", timeout=5).json()
    return next((a for a in doc["alerts"] if a["alertname"] == name), None)


def test_agent_killed_20s_into_a_30s_for_fires_within_15s_of_coming_back(
    tmp_path: Path,
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    rules = {
        "groups": [
            {"name": "g", "rules": [{"alert": "Held", "expr": "vector(1) > 0", "for": "30s"}]}
        ]
    }
    cmd = _agent_cmd(tmp_path, port, rules)
    log = tmp_path / "agent.log"
    with running(cmd, log_path=log) as proc:
        wait_http(f"{base}/readyz", 60, proc)
        first = wait_until(lambda: _alert(base, "Held"), 20, "Held pending")
        assert isinstance(first, dict) and first["state"] == "pending"
        active_since = float(first["active_since"])  # type: ignore[arg-type]
        # 20 s into the 30 s `for` (the agent stamps evaluations with wall-clock time)
        wait_until(lambda: time.time() - active_since >= 20, 40, "20 s of pending")
        held = _alert(base, "Held")
        assert held is not None and held["state"] == "pending"
        os.killpg(proc.pid, signal.SIGKILL)  # no clean shutdown
        proc.wait(10)
    saved = json.loads((tmp_path / "state" / "alerts_for_state.json").read_text())
    (entry,) = saved["alerts"]
    assert entry["rule"] == "Held" and entry["active_at"] == active_since

    with running(cmd, log_path=log) as proc:
        wait_http(f"{base}/readyz", 60, proc)
        back, back_wall = time.monotonic(), time.time()
        fired = wait_until(
            lambda: (a := _alert(base, "Held")) is not None and a["state"] == "firing" and a,
            15,
            "Held firing within 15 s of the agent coming back",
        )
        took = time.monotonic() - back
        assert isinstance(fired, dict)
        # restored, not begun again: its `for` (shifted by the downtime) began about
        # 20 s before this process answered; a fresh one would begin after it started
        assert float(fired["active_since"]) < back_wall - 15  # type: ignore[arg-type]
    print(f"fired {took:.1f} s after the restarted agent answered")
    assert "restored the 'for' state of 1 alert(s) of group g" in log.read_text()


def test_a_group_with_interval_5s_is_evaluated_every_5s(tmp_path: Path) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    rules = {
        "groups": [
            {"name": "each-tick", "rules": [{"record": "r:tick", "expr": "vector(1)"}]},
            {
                "name": "every-5s",
                "interval": "5s",
                "rules": [{"record": "r:five", "expr": "vector(5)"}],
            },
        ]
    }
    seen: dict[str, list[float]] = {"each-tick": [], "every-5s": []}

    def poll() -> bool:
        for g in httpx.get(f"{base}/api/v1/rules", timeout=5).json()["groups"]:
            last = g["last_evaluation"]
            if last is not None and last not in seen[g["name"]]:
                seen[g["name"]].append(last)
        return len(seen["every-5s"]) >= 4

    with running(_agent_cmd(tmp_path, port, rules), log_path=tmp_path / "agent.log") as proc:
        wait_http(f"{base}/readyz", 60, proc)
        wait_until(poll, 40, "four evaluations of the 5 s group")
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
    five = seen["every-5s"]
    steps = [round(b - a, 3) for a, b in itertools.pairwise(five)]
    assert steps == [5.0] * (len(five) - 1)
    # the default group runs on the agent's 1 s tick, more often than the 5 s one
    ticks = seen["each-tick"]
    assert len(ticks) > len(five)
    assert min(round(b - a, 3) for a, b in itertools.pairwise(ticks)) == 1.0
    assert 'kcops_rule_group_interval_seconds{rule_group="every-5s"} 5' in metrics
    assert 'kcops_rule_group_last_evaluation_timestamp_seconds{rule_group="every-5s"}' in metrics
