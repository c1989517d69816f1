"""Torn audit tails, wrong-shaped state files, leftover temp files, and kill -9 mid-write."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kcops.agent.actions.audit import AuditLog, read_audit
from kcops.agent.actions.statefile import read_state, write_atomic


def test_torn_tail_is_set_aside_and_loses_no_later_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.append({"ts": 1.0, "n": 1})
    log.close()
    with open(path, "ab") as fh:
        fh.write(b'{"ts": 2.0, "n": 2, "tr')  # a crash in the middle of a write
    log = AuditLog(path)
    log.append({"ts": 3.0, "n": 3})
    log.close()
    assert [r["n"] for r in read_audit(path)] == [1, 3]
    assert log.torn_repairs == 1 and log.torn_bytes == len(b'{"ts": 2.0, "n": 2, "tr')
    assert (tmp_path / "audit.jsonl.torn").read_bytes() == b'{"ts": 2.0, "n": 2, "tr\n'


def test_append_on_the_loop_defers_fsync_and_sync_awaits_it(tmp_path: Path) -> None:
    async def body() -> None:
        log = AuditLog(tmp_path / "a.jsonl")
        for i in range(500):
            log.append({"ts": float(i), "alert": "unknown"})  # no fsync on the loop
        assert len(list(read_audit(log.path))) == 500  # written: readers see them
        await log.sync()
        assert log.unsynced == 0
        log.close()

    asyncio.run(body())


def test_wrong_shaped_state_is_set_aside_never_fatal(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for bad in (b'{"ladders": [1, 2]}', b'{"replicas": -5}', b"[]", b"\xff\xfe", b"{" * 10_000):
        path.write_bytes(bad)
        assert read_state(path) == {}
        assert not path.exists() and (tmp_path / "state.json.corrupt").read_bytes() == bad
    write_atomic(path, {"version": 1, "ended": {"A": 5.0}, "replicas": 2, "extra": 1})
    assert read_state(path) == {"version": 1, "guards": {}, "ladders": {}, "ended": {"A": 5.0},
                                "restores": {}, "replicas": 2}  # fmt: skip


def test_leftover_temp_files_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    (tmp_path / ".state.json.12345.tmp").write_text("{half")
    write_atomic(path, {"version": 1})
    read_state(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


WRITER = r"""
import sys
from pathlib import Path
from kcops.agent.actions.audit import AuditLog
from kcops.agent.actions.statefile import write_atomic
d = Path(sys.argv[1])
log = AuditLog(d / "audit.jsonl")
i = 0
while True:
    log.append({"ts": float(i), "n": i, "pad": "x" * (i % 500)})  # durable on return here
    write_atomic(d / "state.json", {"version": 1, "ended": {"n": float(i)}})
    print(i, flush=True)  # acknowledged
    i += 1
"""


def test_kill_9_mid_write_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    for round_ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        acked = -1
        deadline = time.monotonic() + 30
        target = 50 + 37 * round_
        while acked < target and time.monotonic() < deadline:
            acked = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for line in proc.stdout:  # acknowledged before the kill landed
            acked = int(line)
        log = AuditLog(tmp_path / "audit.jsonl")
        log._open()  # a restart repairs the tail
        log.close()
        ns = [r["n"] for r in read_audit(tmp_path / "audit.jsonl")]
        # every round restarts at 0: this run's records are the tail, whole and in order
        run = ns[len(ns) - 1 - ns[::-1].index(0) :]
        assert run == list(range(len(run))) and len(run) >= acked + 1
        assert (tmp_path / "audit.jsonl").read_bytes().endswith(b"\n")
        state = read_state(tmp_path / "state.json")
        assert state["ended"]["n"] >= acked
        assert not list(tmp_path.glob(".state.json.*.tmp"))
    json.loads((tmp_path / "audit.jsonl").read_text().splitlines()[-1])
