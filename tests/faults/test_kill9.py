"""kill -9 of the real agent at random moments while it writes audit records and state.

A client posts Alertmanager batches (unknown alerts: one audit record each; and
instances of a laddered rule: state rewrites) as fast as the agent acknowledges
them. At a random moment the agent gets SIGKILL; the next agent starts on the same
state dir. Every batch acknowledged with a 200 must be in the audit log, every line
of the log must be whole, and the state file must load (nothing set aside).
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.faults.conftest import RealAgent, start_agent, stop_agent

pytestmark = pytest.mark.slow
BATCH = 40


def _batch(n: int) -> dict[str, object]:
    alerts: list[dict[str, object]] = [
        {"status": "firing", "labels": {"alertname": f"Kill9Batch{n}", "i": str(i)}}
        for i in range(BATCH)
    ]
    alerts.append(
        {
            "status": "firing",
            "labels": {"alertname": "KcopsKCSurge", "n": str(n), "severity": "ticket"},
            "fingerprint": f"kill9-{n}",
        }
    )
    return {"version": "4", "alerts": alerts}


class Poster:
    """Posts batch after batch until the agent stops answering; remembers the 200s."""

    def __init__(self, agent: RealAgent, first: int) -> None:
        self.agent = agent
        self.next = first
        self.acked: list[int] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while True:
                n = self.next
                try:
                    r = client.post(
                        self.agent.url + "/api/v1/alertmanager",
                        json=_batch(n),
                        headers=self.agent.headers(),
                    )
                except httpx.HTTPError:
                    return  # killed: this batch was never acknowledged
                if r.status_code == 200:
                    self.acked.append(n)
                self.next += 1


def _audited_batches(state_dir: Path) -> dict[int, set[str]]:
    """Batch number -> the alert indexes its audit records name; every line must be whole."""
    out: dict[int, set[str]] = {}
    raw = (state_dir / "audit.jsonl").read_bytes()
    assert raw.endswith(b"\n"), raw[-200:]
    for line in raw.splitlines():
        rec = json.loads(line)  # whole: a torn tail was set aside, not glued to
        name = str((rec.get("trigger") or {}).get("alertname", ""))
        if name.startswith("Kill9Batch"):
            labels = rec["trigger"]["labels"]
            out.setdefault(int(name[len("Kill9Batch") :]), set()).add(labels["i"])
    return out


def test_kill_9_of_the_agent_loses_no_acknowledged_record(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    tmp = tmp_path_factory.mktemp("kill9")
    acked: list[int] = []
    first = 0
    for round_ in range(3):
        agent = start_agent(tmp)
        try:
            status = httpx.get(agent.url + "/api/v1/remediation", timeout=5).json()
            assert status["state_files_set_aside"] == 0, (seed, round_)
            poster = Poster(agent, first)
            poster.thread.start()
            while len(poster.acked) < 3:  # writing for real before the kill window opens
                assert poster.thread.is_alive(), agent.log.read_text()[-2000:]
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 1.5))
            os.kill(agent.proc.pid, signal.SIGKILL)
            agent.proc.wait()
            poster.thread.join(15)
            acked += poster.acked
            first = poster.next + 1
        finally:
            stop_agent(agent)
        assert not list((tmp / "state").glob("*.corrupt")), (seed, round_)
    last = start_agent(tmp)  # repairs the last kill's torn tail, loads the state
    try:
        status = httpx.get(last.url + "/api/v1/remediation", timeout=5).json()
        assert status["state_files_set_aside"] == 0, seed
        r = httpx.post(
            last.url + "/api/v1/alertmanager",
            json=_batch(first),
            headers=last.headers(),
            timeout=10,
        )
        assert r.status_code == 200
    finally:
        stop_agent(last)
    audited = _audited_batches(tmp / "state")
    want = {str(i) for i in range(BATCH)}
    lost = [n for n in acked if audited.get(n) != want]
    assert not lost, f"seed {seed}: acknowledged batches not (wholly) in the audit: {lost[:10]}"
    assert len(acked) >= 9 and audited.get(first) == want
    assert not list((tmp / "state").glob(".remediation-state.json.*.tmp"))
    assert "Traceback" not in last.log.read_text()
