"""A real agent for the fault suite: a subprocess on a free port, with a token and a probe."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from tests.services import free_port

TOKEN = "fault-suite-token"
AGENT_CMD = (sys.executable, "-c", "from kcops.cli import main; main()", "agent", "run")


@dataclass
class RealAgent:
    url: str
    proc: subprocess.Popen[bytes]
    state_dir: Path
    probe_socket: Path
    log: Path

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def status(self) -> dict[str, object]:
        return dict(httpx.get(self.url + "/api/v1/status", timeout=5).json())

    def healthy_collectors(self) -> set[str]:
        comps = self.status()["components"]
        cols = comps["collectors"]["collectors"]  # type: ignore[index]
        return {name for name, h in cols.items() if h["ok"]}

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


def start_agent(tmp: Path, *, extra: dict[str, object] | None = None) -> RealAgent:
    port = free_port()
    sock = tmp / "probe.sock"
    cfg: dict[str, object] = {
        "agent": {"listen": f"127.0.0.1:{port}", "state_dir": str(tmp / "state"), "tick_s": 0.2},
        "collectors": {"probe": {"socket_path": str(sock)}},
        "actions": {"mode": "dry-run"},
    }
    for k, v in (extra or {}).items():
        cfg.setdefault(k, {}).update(v)  # type: ignore[attr-defined]
    (tmp / "agent.yaml").write_text(yaml.safe_dump(cfg))
    log = tmp / "agent.log"
    env = {**os.environ, "KCOPS_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*AGENT_CMD, "--config", str(tmp / "agent.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=open(log, "wb"),  # noqa: SIM115 - the child owns it
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"agent exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200 and sock.exists():
                return RealAgent(url, proc, tmp / "state", sock, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"agent not ready in 60 s: {log.read_text()[-2000:]}")


def stop_agent(agent: RealAgent) -> None:
    if agent.proc.poll() is None:
        agent.proc.send_signal(signal.SIGTERM)
        try:
            agent.proc.wait(15)
        except subprocess.TimeoutExpired:
            agent.proc.kill()
            agent.proc.wait()


@pytest.fixture(scope="module")
def real_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealAgent]:
    agent = start_agent(tmp_path_factory.mktemp("agent"))
    try:
        yield agent
    finally:
        stop_agent(agent)
    assert "Traceback" not in agent.log.read_text(), agent.log.read_text()[-3000:]


@dataclass
class RealWorker:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path


@pytest.fixture(scope="module")
def real_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealWorker]:
    tmp = tmp_path_factory.mktemp("worker")
    port = free_port()
    log = tmp / "worker.log"
    (tmp / "token").write_text(TOKEN)
    cmd = [sys.executable, "-c", "from kcops.cli import main; main()", "serve", "--model", "tiny"]
    cmd += ["--port", str(port), "--no-probe", "--threads", "1", "--token-file", str(tmp / "token")]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"worker did not start: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    try:
        yield RealWorker(url, port, proc, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text()[-3000:]
