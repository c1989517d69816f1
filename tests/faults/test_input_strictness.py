"""Issue 24, classes 9, 10 and 12 against real processes.

- ``kcops agent check-config`` and ``kcops agent run`` agree: 20 hostile rule files (none of
  them the earlier rounds' list), YAML 1.1 booleans, a repeated key and a non-loopback
  listen address without a token are refused by both, exit 2, with the same line.
- A webhook of 5,200 alerts (the issue's) is answered 200: the 1,000 most severe taken,
  the rest named in the answer and counted in kcops_webhook_alerts_dropped_total.
- Webhook fields outside Alertmanager's types are a JSON 400, and the agent stays well.
- A real Alertmanager with deploy/alertmanager/kcops-receiver.yml (max_alerts) truncates a
  large group itself, and the agent counts what it left out.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from kcops.agent.remediation.alertmanager import MAX_ALERTS
from tests.faults.conftest import TOKEN, RealAgent
from tests.services import free_port, need_binary, running, wait_http, wait_until

REPO = Path(__file__).resolve().parents[2]
KCOPS = (sys.executable, "-c", "from kcops.cli import main; main()")
GOOD_RULE = "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up == 0\n"

# Rule files none of which the earlier rounds' lists hold (tests/faults/test_yaml_loading.py).
HOSTILE_RULES: dict[str, bytes] = {
    "a repeated key in a rule": GOOD_RULE.encode() + b"    expr: up == 1\n",
    "a repeated severity label": GOOD_RULE.encode()
    + b"    labels: {severity: page, severity: x}\n",
    "a repeated group name": (GOOD_RULE + "- name: g\n  rules: []\n").encode(),
    "a repeated rule name": (GOOD_RULE + "  - alert: A\n    expr: up == 1\n").encode(),
    "PromQL that does not parse": b"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up ==\n",
    "an unknown function": b"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: nope(up)\n",
    "a regex that does not compile": (
        b'groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up{job=~"(("}\n'
    ),
    "an undefined template function": GOOD_RULE.encode() + b"    annotations: {s: '{{ bogus }}'}\n",
    "an unknown param": b"groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up > ${nope}\n",
    "a non-finite param": b"params: {t: .nan}\n" + GOOD_RULE.encode(),
    "for: 1.5m": GOOD_RULE.encode() + b"    for: 1.5m\n",
    "a negative interval": b"groups:\n- name: g\n  interval: -1s\n  rules: []\n",
    "an unknown remediation action": GOOD_RULE.encode() + b"    remediation: [{action: nuke}]\n",
    "alert and record together": GOOD_RULE.encode() + b"    record: x:y\n",
    "a list as a label value": GOOD_RULE.encode() + b"    labels: {severity: [1]}\n",
    "a rule without expr": b"groups:\n- name: g\n  rules:\n  - alert: A\n",
    "groups a mapping": b"groups: {name: g}\n",
    "latin-1 bytes in a summary": GOOD_RULE.encode() + b"    annotations: {s: caf\xe9}\n",
    "a bad label name": GOOD_RULE.encode() + b"    labels: {'0bad': x}\n",
    "a directory, not a file": b"",  # replaced by a directory below
}
assert len(HOSTILE_RULES) == 20


def _kcops(args: list[str], env: dict[str, str] | None = None) -> tuple[int, str, float]:
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full.pop("KCOPS_TOKEN", None) if env is None or "KCOPS_TOKEN" not in env else None
    t0 = time.monotonic()
    try:
        res = subprocess.run([*KCOPS, *args], capture_output=True, env=full, timeout=60)
    except subprocess.TimeoutExpired:
        return -1, "still running after 60 s (it started)", 60.0
    return res.returncode, res.stderr.decode(errors="replace"), time.monotonic() - t0


def _error_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.startswith("error: ")]
    return lines[-1] if lines else f"<no error line in {stderr[-500:]!r}>"


def _both(tmp: Path, name: str, cfg: str, extra: list[str]) -> tuple[str, Any, Any]:
    folder = tmp / f"c{abs(hash(name))}"
    folder.mkdir()
    (folder / "agent.yaml").write_text(cfg)
    flags = ["--state-dir", str(folder / "state"), *extra]
    check = _kcops(["agent", "check-config", str(folder / "agent.yaml"), *flags])
    run = _kcops(["agent", "run", "--config", str(folder / "agent.yaml"), *flags])
    return name, check, run


@pytest.mark.slow
def test_check_config_and_agent_run_agree(tmp_path: Path) -> None:
    port = free_port()
    loopback = f"agent: {{listen: '127.0.0.1:{port}'}}\n"
    cases: list[tuple[str, str, list[str]]] = []
    for name, raw in HOSTILE_RULES.items():
        path = tmp_path / f"r{len(cases)}.yaml"
        if name == "a directory, not a file":  # named by the file: click checks the flag
            path.mkdir()
            cases.append((f"rules: {name}", loopback + f"rules: {{file: '{path}'}}\n", []))
            continue
        path.write_bytes(raw)
        cases.append((f"rules: {name}", loopback, ["--rules", str(path)]))
    cases += [
        ("listen 0.0.0.0 without a token", "agent: {listen: '0.0.0.0:0'}\n", []),
        ("listen on a host name without a token", "agent: {listen: 'example.org:0'}\n", []),
        ("--listen [::] without a token", loopback, ["--listen", "[::]:0"]),
        ("rules.enabled: yes", loopback + "rules: {enabled: yes}\n", []),
        ("a repeated key in the config", loopback + "agent: {tick_s: 1}\n", []),
    ]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda c: _both(tmp_path, *c), cases))
    print(f"\n{'case':<40} {'check-config':>14} {'agent run':>12}")
    disagree = []
    for name, (c_code, c_err, c_s), (r_code, r_err, r_s) in results:
        line = _error_line(c_err).replace(str(tmp_path), "TMP")
        print(f"{name:<40} exit {c_code} {c_s:5.2f}s   exit {r_code} {r_s:5.2f}s  {line[:110]}")
        if not (c_code == r_code == 2 and _error_line(c_err) == _error_line(r_err)):
            disagree.append(f"{name}: check-config {c_code} {c_err!r} / run {r_code} {r_err!r}")
        assert "Traceback" not in c_err + r_err, (name, c_err, r_err)
        assert c_err.count("\n") == 1, (name, c_err)  # one line
    assert not disagree, "\n".join(disagree)


@pytest.mark.slow
def test_check_config_says_ok_where_agent_run_starts(tmp_path: Path) -> None:
    rules = tmp_path / "r.yaml"
    rules.write_text(GOOD_RULE)
    port = free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"agent: {{listen: '0.0.0.0:{port}', state_dir: '{tmp_path / 's'}'}}\n")
    env = {"KCOPS_TOKEN": TOKEN}
    code, err, _ = _kcops(["agent", "check-config", str(cfg), "--rules", str(rules)], env)
    assert code == 0, err
    cmd = [*KCOPS, "agent", "run", "--config", str(cfg), "--rules", str(rules)]
    with running(cmd, log_path=tmp_path / "a.log", env={**env, "PYTHONPATH": str(REPO)}) as p:
        wait_http(f"http://127.0.0.1:{port}/readyz", 30, p)


# -- the webhook, against the module's real agent ---------------------------------------------


def _alert(name: str, severity: str | None, status: str = "firing") -> dict[str, Any]:
    labels = {"alertname": name, **({"severity": severity} if severity else {})}
    return {
        "status": status,
        "labels": labels,
        "startsAt": "2024-05-01T12:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        "fingerprint": f"{abs(hash(name)):016x}"[:16],
    }


def _dropped(agent: RealAgent) -> dict[str, float]:
    out = {}
    for line in httpx.get(agent.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("kcops_webhook_alerts_dropped_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


def test_webhook_over_the_cap_takes_the_most_severe(real_agent: RealAgent) -> None:
    before = wait_until(lambda: _dropped(real_agent) or None, 10, "the dropped counter")
    alerts = (
        [_alert(f"KcopsOther{i}", None) for i in range(3000)]
        + [_alert(f"KcopsTicket{i}", "ticket") for i in range(1000)]
        + [_alert(f"KcopsPageResolved{i}", "page", "resolved") for i in range(600)]
        + [_alert(f"KcopsPage{i}", "page") for i in range(600)]
    )
    assert len(alerts) == 5200
    t0 = time.monotonic()
    r = httpx.post(
        real_agent.url + "/api/v1/alertmanager",
        json={"version": "4", "alerts": alerts},
        headers=real_agent.headers(),
        timeout=30,
    )
    took = time.monotonic() - t0
    body = r.json()
    print(f"\n5,200 alerts: HTTP {r.status_code} in {took:.2f} s: {body}")
    assert r.status_code == 200, r.text
    assert body["accepted"] == MAX_ALERTS and body["dropped"] == 4200
    # 600 pages firing, 400 of the 600 resolved pages; no ticket, no other
    assert body["dropped_by_severity"] == {"page": 200, "ticket": 1000, "other": 3000}
    want = before.get("over_cap", 0) + 4200
    got = wait_until(lambda: _dropped(real_agent).get("over_cap") == want or None, 10, "the metric")
    assert got
    assert httpx.get(real_agent.url + "/healthz", timeout=1).status_code == 200


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": 7}}]}',
         "must be a string"),
        ('{"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": "A"},'
         ' "startsAt": NaN}]}', "bare NaN"),
        ('{"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": "A"},'
         ' "startsAt": "2024-02-30T00:00:00Z"}]}', "not a real time"),
        ('{"version": "4", "alerts": [{"status": "firing", "labels": {"alertname": "A"},'
         ' "endsAt": "yesterday"}]}', "not an RFC 3339"),
        ('{"version": "4", "alerts": [{"status": "burning", "labels": {"alertname": "A"}}]}',
         "allowed: firing, resolved"),
        ('{"version": "4", "version": "4", "alerts": []}', "appears twice"),
        ('{"version": "4", "alerts": [], "truncatedAlerts": 1e999}', "out of range"),
    ],
)  # fmt: skip
def test_webhook_fields_in_alertmanagers_types(
    real_agent: RealAgent, content: str, needle: str
) -> None:
    r = httpx.post(
        real_agent.url + "/api/v1/alertmanager",
        content=content.encode(),
        headers={**real_agent.headers(), "Content-Type": "application/json"},
        timeout=10,
    )
    assert r.status_code == 400 and needle in r.json()["error"], r.text
    assert httpx.get(real_agent.url + "/healthz", timeout=1).status_code == 200


# -- a real Alertmanager with the receiver deploy/ ships ------------------------------------------


def _receiver_config(agent_port: int, token_file: Path) -> str:
    text = (REPO / "deploy" / "alertmanager" / "kcops-receiver.yml").read_text()
    text = text.replace("kcops-agent.NAMESPACE.svc:9464", f"127.0.0.1:{agent_port}")
    text = text.replace("/etc/alertmanager/secrets/kcops-token/token", str(token_file))
    # the test does not wait the production timings
    for key, value in (("group_wait", "1s"), ("group_interval", "1s")):
        text = text.replace(f"{key}: 10s", f"{key}: {value}").replace(
            f"{key}: 1m", f"{key}: {value}"
        )
    return text


@pytest.mark.slow
def test_alertmanager_with_the_shipped_receiver_truncates_and_the_agent_counts(
    real_agent: RealAgent, tmp_path: Path
) -> None:
    am_bin = need_binary("prometheus-alertmanager")
    amtool = need_binary("amtool")
    token = tmp_path / "token"
    token.write_text(TOKEN)
    agent_port = int(real_agent.url.rsplit(":", 1)[1])
    conf = tmp_path / "am.yml"
    conf.write_text(_receiver_config(agent_port, token))
    check = subprocess.run([amtool, "check-config", str(conf)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    am_port = free_port()
    am = f"http://127.0.0.1:{am_port}"
    cmd = [
        am_bin, f"--config.file={conf}", f"--storage.path={tmp_path / 'am'}",
        f"--web.listen-address=127.0.0.1:{am_port}", "--cluster.listen-address=",
    ]  # fmt: skip
    before = _dropped(real_agent).get("truncated_by_alertmanager", 0)
    n = MAX_ALERTS + 234
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    alerts = [
        {"labels": {"alertname": "KcopsBigGroup", "engine": "e", "pod": f"p{i}"}, "startsAt": now}
        for i in range(n)
    ]
    with running(cmd, log_path=tmp_path / "am.log") as proc:
        wait_http(f"{am}/-/ready", 30, proc)
        r = httpx.post(f"{am}/api/v2/alerts", json=alerts, timeout=30)
        assert r.status_code == 200, r.text
        got = wait_until(
            lambda: _dropped(real_agent).get("truncated_by_alertmanager", 0) - before or None,
            30,
            "the agent to count what Alertmanager truncated",
            lambda: (tmp_path / "am.log").read_text()[-2000:],
        )
    print(f"\nAlertmanager sent {MAX_ALERTS} of {n}; the agent counted {got:.0f} truncated")
    assert got == n - MAX_ALERTS
    assert "status code 4" not in (tmp_path / "am.log").read_text()
