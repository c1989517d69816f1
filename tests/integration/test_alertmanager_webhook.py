"""A real prometheus-alertmanager delivers its webhook to a real `kcops agent run`.

The cluster alert names a rule of the agent's rule file, so it joins that
rule's ladder (scale_out here: no engine needed). A receiver without the
token gets 401 from the agent and changes nothing.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.services import free_port, kcops_bin, need_binary, running, wait_http, wait_until

TOKEN = "am-test-token"

RULES = """
groups:
  - name: test
    rules:
      - alert: KcopsKCSurge
        expr: kcops_test_never_present > 1
        for: 1s
        remediation:
          - {action: scale_out, params: {step: 2}, verify: 1m}
      - alert: KcopsSecond
        expr: kcops_test_never_present > 1
        for: 1s
        remediation:
          - {action: scale_out, params: {step: 5}, verify: 1m}
"""


def am_config(agent_port: int) -> str:
    url = f"http://127.0.0.1:{agent_port}/api/v1/alertmanager"
    return f"""
route:
  receiver: kcops
  group_by: [alertname]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
  routes:
    - matchers: ['auth="none"']
      receiver: noauth
receivers:
  - name: kcops
    webhook_configs:
      - url: {url}
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials: {TOKEN}
  - name: noauth
    webhook_configs:
      - url: {url}
        send_resolved: true
"""


def iso(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def post_alert(am: str, labels: dict[str, str], ends: datetime | None = None) -> None:
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": {"summary": "test"},
        "startsAt": iso(datetime.now(UTC) - timedelta(seconds=5)),
        "generatorURL": "http://prometheus.test/graph",
    }
    if ends is not None:
        alert["endsAt"] = iso(ends)
    r = httpx.post(f"{am}/api/v2/alerts", json=[alert], timeout=5)
    assert r.status_code == 200, r.text


def audit(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def metric(agent: str, name: str) -> float | None:
    for line in httpx.get(f"{agent}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.slow
def test_alertmanager_delivers_to_the_agent(tmp_path: Path) -> None:
    am_bin = need_binary("prometheus-alertmanager")
    agent_port, am_port = free_port(), free_port()
    agent, am = f"http://127.0.0.1:{agent_port}", f"http://127.0.0.1:{am_port}"
    state = tmp_path / "state"
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    # An HPA scales on kcops_desired_replicas: scale_out has a scaler (else it is refused).
    config = tmp_path / "agent.yaml"
    config.write_text("actions: {scale: {hpa_reads_gauge: true}}\n")
    (tmp_path / "am.yml").write_text(am_config(agent_port))
    agent_cmd = [
        kcops_bin(), "agent", "run", "--listen", f"127.0.0.1:{agent_port}", "--config", str(config),
        "--state-dir", str(state), "--rules", str(rules), "--mode", "enforce", "--tick", "0.2",
    ]  # fmt: skip
    am_cmd = [
        am_bin, f"--config.file={tmp_path / 'am.yml'}", f"--storage.path={tmp_path / 'am'}",
        f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
    ]  # fmt: skip
    with (
        running(agent_cmd, log_path=tmp_path / "agent.log", env={"KCOPS_TOKEN": TOKEN}) as ap,
        running(am_cmd, log_path=tmp_path / "am.log") as mp,
    ):
        wait_http(f"{agent}/readyz", 30, ap)
        wait_http(f"{am}/-/ready", 30, mp)
        assert metric(agent, "kcops_desired_replicas") == 1.0

        # Without the token: 401, nothing changes.
        r = httpx.post(f"{agent}/api/v1/alertmanager", json={"version": "4", "alerts": []})
        assert r.status_code == 401
        post_alert(am, {"alertname": "KcopsSecond", "auth": "none", "severity": "page"})
        wait_until(
            lambda: "401" in (tmp_path / "am.log").read_text(),
            20,
            "alertmanager to report the agent's 401",
        )
        assert not any("KcopsSecond" in json.dumps(x) for x in audit(state))
        assert metric(agent, "kcops_desired_replicas") == 1.0

        # With the token: the alert joins the local rule's ladder.
        post_alert(am, {"alertname": "KcopsKCSurge", "severity": "page", "pod": "p1"})
        runs = wait_until(
            lambda: [x for x in audit(state) if x.get("kind") == "action"],
            20,
            "the scale_out run",
        )
        assert runs[0]["action"] == "scale_out" and runs[0]["outcome"] == "ok"
        assert runs[0]["trigger"]["source"] == "alertmanager"
        assert runs[0]["trigger"]["alertname"] == "KcopsKCSurge"
        assert runs[0]["before"] == {"replicas": 1} and runs[0]["after"] == {"replicas": 3}
        wait_until(lambda: metric(agent, "kcops_desired_replicas") == 3.0, 5, "gauge at 3")
        assert metric(agent, 'kcops_action_runs_total{action="scale_out",outcome="ok"}') == 1.0

        # Resolved by Alertmanager: the ladder closes.
        post_alert(am, {"alertname": "KcopsKCSurge", "severity": "page", "pod": "p1"},
                   ends=datetime.now(UTC) - timedelta(seconds=1))  # fmt: skip
        wait_until(
            lambda: any(
                x.get("kind") == "ladder" and x.get("event") == "resolved" for x in audit(state)
            ),
            20,
            "the ladder to resolve",
        )
        assert len([x for x in audit(state) if x.get("kind") == "action"]) == 1
