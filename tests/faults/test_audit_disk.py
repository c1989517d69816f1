"""The audit log on a full disk (a real tmpfs) and under kill -9, against a real agent.

- On a full disk every record the agent acknowledged (an answer other than 503) is
  in the log, as valid JSON, before, during and after; what it held in memory while
  the disk was full is written once space returns, once.
- ``kill -9`` while an action runs leaves its ``started`` record; the next agent
  writes its ``interrupted`` outcome.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.auditread import ReadStats, read_audit
from kcops.agent.remediation.records import parse_record
from tests.faults.conftest import RealAgent, start_agent, stop_agent

NONFINITE = (b"NaN", b"Infinity")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(fs: Path) -> int:
    """Fill ``fs`` to the last byte (raw writes, no buffer); returns the bytes written."""
    n = 0
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (65536, 4096, 64, 1):
            while True:
                try:
                    w = os.write(fd, b"x" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
                n += w
                if w < chunk:
                    break
    finally:
        os.close(fd)
    return n


def check_log(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    assert not any(t in raw for t in NONFINITE)
    assert raw.endswith(b"\n")
    stats = ReadStats()
    recs = list(read_audit(path, stats=stats))
    assert (stats.invalid, stats.recovered) == (0, 0), raw[-2000:]
    assert len(recs) == raw.count(b"\n")
    return recs


def test_audit_log_on_a_full_tmpfs_keeps_every_record(tmp_path: Path) -> None:
    """Real short writes and ENOSPC (tmpfs): no fragment, no loss, no duplicate."""
    with tmpfs(tmp_path / "fs", "64k") as fs:
        log = AuditLog(fs / "audit.jsonl")
        log.append(parse_record({"ts": 0.0, "n": 0, "pad": "p" * 200}))
        filled = fill(fs)
        n = 1
        while log.held < 20:  # records the disk refused
            log.append(parse_record({"ts": float(n), "n": n, "pad": "p" * 200}))
            n += 1
        written_while_full = n - log.held
        check_log(fs / "audit.jsonl")
        (fs / "filler").unlink()
        log.tick(1e9)
        log.append(parse_record({"ts": float(n), "n": n}))
        log.close()
        recs = check_log(fs / "audit.jsonl")
        assert [r["n"] for r in recs] == list(range(n + 1))
        print(
            f"\nfull tmpfs: filled {filled} B, {written_while_full} record(s) written, 20 held "
            f"in memory, {log.write_errors} failed writes; all {n + 1} in order after, once"
        )


class Webhook(BaseHTTPRequestHandler):
    """The notify webhook: answers at once, or after ``delay_s``."""

    delay_s = 0.0
    hits = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).hits += 1
        time.sleep(self.delay_s)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def webhook(delay_s: float) -> Iterator[str]:
    handler = type("Hook", (Webhook,), {"delay_s": delay_s, "hits": 0})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/hook"
    finally:
        srv.shutdown()
        srv.server_close()


def enforcing(url: str, timeout_s: float = 120.0) -> dict[str, object]:
    return {
        "actions": {
            "mode": "enforce",
            "notify": {"url": url, "timeout_s": 30.0},
            "guards": {
                "cooldown_s": 0,
                "budget_per_hour": 100_000,
                "action_budget_per_hour": 100_000,
                "action_timeout_s": timeout_s,
            },
        }
    }


def post_run(agent: RealAgent, n: int, params: dict[str, object] | None = None) -> httpx.Response:
    body = {"params": params or {"message": f"run {n}"}, "force": True, "reason": "fault test"}
    return httpx.post(
        agent.url + "/api/v1/actions/notify", json=body, headers=agent.headers(), timeout=60
    )


def test_real_agent_on_a_full_disk_loses_no_acknowledged_record(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "fs", "512k") as fs, webhook(0.0) as url:
        agent = start_agent(tmp_path, extra=enforcing(url))
        # the agent's state dir on the small tmpfs
        stop_agent(agent)
        cfg = (tmp_path / "agent.yaml").read_text().replace(str(tmp_path / "state"), str(fs))
        (tmp_path / "agent.yaml").write_text(cfg)
        agent = _restart(tmp_path, fs, url)
        acked: dict[str, str] = {}  # run_id -> phase
        refused: list[str] = []
        try:
            counts = {}
            for phase, n_runs in (("before", 20), ("during", 40), ("after", 20)):
                if phase == "during":
                    filled = fill(fs)
                if phase == "after":
                    (fs / "filler").unlink()
                n503 = 0
                for i in range(n_runs):
                    r = post_run(agent, i, {"message": f"{phase} {i}", "severity": "info"})
                    body = r.json()
                    if r.status_code == 503:
                        n503 += 1
                        refused.append(str(body["record"]["run_id"]))
                        assert "not durable" in body["error"]
                        continue
                    assert r.status_code == 200, (phase, r.status_code, r.text[:300])
                    acked[str(body["run_id"])] = phase
                counts[phase] = (n_runs - n503, n503)
            # a bad parameter is refused, in one line, and nothing non-finite is written
            r = httpx.post(
                agent.url + "/api/v1/actions/fallback_to_base",
                content=b'{"params": {"hold_s": Infinity}, "force": true, "reason": "x"}',
                headers={**agent.headers(), "Content-Type": "application/json"},
                timeout=10,
            )
            assert r.status_code in (400, 422), r.text
            deadline = time.monotonic() + 10
            while agent.status()["components"]["remediation"]["audit_held"]:  # type: ignore[index]
                assert time.monotonic() < deadline, "held records never written"
                time.sleep(0.2)
        finally:
            stop_agent(agent)
        recs = check_log(fs / "audit.jsonl")
        outcome_of = {
            str(r["run_id"]): r["outcome"] for r in recs if r["kind"] == "action" and "run_id" in r
        }
        ends = [r["run_id"] for r in recs if r["kind"] == "action"]
        missing = [rid for rid in acked if outcome_of.get(rid) != "ok"]
        assert not missing, missing
        assert len(ends) == len(set(ends)), "an outcome written twice"
        late = [rid for rid in refused if rid in outcome_of]
        print(
            f"\nfull disk (tmpfs 512k, filled {filled} B): acknowledged/not (503) before "
            f"{counts['before']}, during {counts['during']}, after {counts['after']}; "
            f"all {len(acked)} acknowledged records in the log as valid JSON; "
            f"{len(late)}/{len(refused)} unacknowledged ones written once space returned"
        )
        assert counts["during"][1] > 0, "the disk never refused a record: not a full-disk test"


def _restart(tmp: Path, state: Path, url: str) -> RealAgent:
    from tests.faults.conftest import AGENT_CMD, TOKEN

    port = int(str(yaml_listen(tmp)).rsplit(":", 1)[1])
    log = tmp / "agent.log"
    env = {**os.environ, "KCOPS_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*AGENT_CMD, "--config", str(tmp / "agent.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),  # noqa: SIM115 - the child owns it
        env=env,
    )
    agent = RealAgent(f"http://127.0.0.1:{port}", proc, state, tmp / "probe.sock", log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(agent.url + "/readyz", timeout=1).status_code == 200:
                return agent
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"agent not ready: {log.read_text()[-2000:]}")


def yaml_listen(tmp: Path) -> str:
    import yaml

    return str(yaml.safe_load((tmp / "agent.yaml").read_text())["agent"]["listen"])


def test_kill9_while_an_action_runs_leaves_started_then_interrupted(tmp_path: Path) -> None:
    with webhook(30.0) as url:  # the action hangs in the webhook's POST
        agent = start_agent(tmp_path, extra=enforcing(url))
        audit = agent.state_dir / "audit.jsonl"
        th = threading.Thread(target=lambda: _quiet(post_run, agent, 1), daemon=True)
        t0 = time.monotonic()
        th.start()
        deadline = t0 + 20
        started: list[dict[str, Any]] = []
        while not started:
            assert time.monotonic() < deadline, "no started record"
            started = [r for r in read_audit(audit) if r["kind"] == "started"]
            time.sleep(0.05)
        seen_s = time.monotonic() - t0
        time.sleep(0.3)  # well inside the running action
        agent.proc.kill()
        agent.proc.wait()
        recs = check_log(audit)
        assert [r["action"] for r in recs if r["kind"] == "started"] == ["notify"]
        assert not [r for r in recs if r["kind"] == "action"]  # it never finished
        rid = started[0]["run_id"]
        agent = _restart(tmp_path, tmp_path / "state", url)
        try:
            deadline = time.monotonic() + 10
            ends: list[dict[str, Any]] = []
            while not ends:
                assert time.monotonic() < deadline, "no interrupted record"
                ends = [r for r in read_audit(audit) if r["kind"] == "action"]
                time.sleep(0.1)
            guards = agent.status()["components"]["remediation"]["guards"]  # type: ignore[index]
        finally:
            stop_agent(agent)
        assert [(r["run_id"], r["outcome"]) for r in ends] == [(rid, "interrupted")]
        print(
            f"\nkill -9 during notify: started record on disk {seen_s:.2f} s after the POST; "
            f"after restart: {ends[0]['outcome']} ({ends[0]['error']}); guards {guards}"
        )


def _quiet(fn: object, *args: object) -> None:
    with contextlib.suppress(Exception):
        fn(*args)  # type: ignore[operator]
