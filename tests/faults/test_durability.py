"""Torn audit tails, wrong-shaped state files, leftover temp files, and kill -9 mid-write."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcops.agent.remediation import audit as audit_mod
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.auditread import read_audit
from kcops.agent.remediation.records import parse_record
from kcops.agent.remediation.remediation import Remediation
from kcops.agent.remediation.statefile import StateFile
from kcops.agent.samples import SeriesKey
from tests.clock import ManualClock
from tests.unit.actions.harness import make_ctx, make_rem, unsynced


def read_state(path: Path) -> dict[str, Any]:
    """The saved state as a dict ({}: none or set aside), read by the state file itself."""
    st = StateFile(path).read()
    return {} if st is None else st.model_dump()


def test_torn_tail_is_set_aside_and_loses_no_later_record(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    log.append(parse_record({"ts": 1.0, "n": 1}))
    log.close()
    with open(path, "ab") as fh:
        fh.write(b'{"ts": 2.0, "n": 2, "tr')  # a crash in the middle of a write
    log = AuditLog(path)
    log.append(parse_record({"ts": 3.0, "n": 3}))
    log.close()
    assert [r["n"] for r in read_audit(path)] == [1, 3]
    assert log.torn_repairs == 1 and log.torn_bytes == len(b'{"ts": 2.0, "n": 2, "tr')
    assert (tmp_path / "audit.jsonl.torn").read_bytes() == b'{"ts": 2.0, "n": 2, "tr\n'


def test_append_on_the_loop_queues_and_sync_awaits_the_writer(tmp_path: Path) -> None:
    """On the loop, append writes nothing itself (no write, no fsync: the log's writer
    thread does both); sync answers once every record is on disk."""

    async def body() -> None:
        log = AuditLog(tmp_path / "a.jsonl")
        loop_thread = threading.get_ident()
        writes: set[int] = set()
        real_write = audit_mod.os.write

        def seen(fd: int, data: bytes) -> int:
            writes.add(threading.get_ident())
            return real_write(fd, data)

        audit_mod.os.write = seen
        try:
            for i in range(500):
                log.append(parse_record({"ts": float(i), "alert": "unknown"}))
            assert await log.sync()
        finally:
            audit_mod.os.write = real_write
        assert unsynced(log) == 0 and len(list(read_audit(log.path))) == 500
        assert writes and loop_thread not in writes  # every write off the loop
        log.close()

    asyncio.run(body())


def test_wrong_shaped_state_is_set_aside_never_fatal(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    for bad in (b'{"ladders": [1, 2]}', b'{"replicas": -5}', b"[]", b"\xff\xfe", b"{" * 10_000):
        path.write_bytes(bad)
        assert read_state(path) == {}
        assert not path.exists() and (tmp_path / "state.json.corrupt").read_bytes() == bad
    StateFile(path).save({"version": 1, "ended": {"A": 5.0}, "replicas": 2, "extra": 1})
    got = read_state(path)
    assert got["ended"] == {"A": 5.0} and got["replicas"] == 2 and "extra" not in got
    assert got["ladders"] == {} and got["guards"]["runs"] == []


LADDER = {
    "alertname": "KcopsOOM",
    "steps": [{"action": "notify", "params": {"message": "m"}, "verify_s": 30.0}],
    "started_at": 100.0,
    "trigger": {"alertname": "KcopsOOM", "labels": {"severity": "page"}, "value": 1.0},
    "step": 0,
    "phase": "verify",
    "verify_until": 130.0,
    "instances": {"local:alertname=KcopsOOM": "local"},
    "history": [],
}
GOOD_STATE = {
    "version": 1,
    "guards": {"runs": [[100.0, "notify"]], "cooldown_until": {"notify|engine": 400.0},
               "breaker_open": {}, "cooldown_owner": {"notify|engine": "KcopsOOM@100.000"}},
    "ladders": {"KcopsOOM": LADDER},
    "ended": {"KcopsHot": 50.0},
    "restores": {"KcopsSlow": {"since": None, "run_id": "r1", "hold_s": 300.0}},
    "addressed": {"KcopsOOM": {"alertmanager:abc": "here"}},
    "replicas": 2,
}  # fmt: skip

# Right at the top level, wrong inside: each of these stopped the agent from starting
# (or failed every tick after it) before the state was typed down to its records.
WRONG_INSIDE = [
    {"version": 1, "ladders": {"X": {}}},
    {"version": 1, "ladders": {"X": {**LADDER, "phase": "bogus"}}},
    {"version": 1, "ladders": {"X": {**LADDER, "step": 7}}},
    {"version": 1, "ladders": {"X": {**LADDER, "steps": [{"action": 5, "verify_s": 1}]}}},
    {"version": 1, "ladders": {"X": {**LADDER, "trigger": {"labels": [1, 2]}}}},
    {"version": 1, "ladders": {"X": {**LADDER, "instances": {"fp": "elsewhere"}}}},
    {"version": 1, "ladders": {"X": {**LADDER, "history": [{"step": 0}]}}},
    {"version": 1, "ladders": {"X": {**LADDER, "started_at": "soon"}}},
    {"version": 1, "guards": {"runs": [1]}},
    {"version": 1, "guards": {"runs": [[1.0, "a", "extra"]]}},
    {"version": 1, "guards": {"cooldown_until": {"a": "x"}}},
    {"version": 1, "guards": {"breaker_open": []}},
    {"version": 1, "restores": {"a": 5}},
    {"version": 1, "restores": {"a": {"since": "x", "hold_s": 1}}},
    {"version": 1, "restores": {"a": {"since": None}}},
    {"version": 1, "ladders": {"X": {**LADDER, "steps": []}}},
    {"version": 1, "addressed": {"A": [1]}},
    {"version": 1, "addressed": {"A": {"fp": 5}}},
    {"version": 2},
]


def _start(tmp_path: Path, state: bytes) -> Remediation:
    (tmp_path / "remediation-state.json").write_bytes(state)
    ctx, _ = make_ctx(tmp_path, None, ManualClock(1000.0), mode="dry-run")

    async def go() -> Remediation:
        rem = await make_rem(ctx)
        await rem.tick(1001.0)  # a tick too: a bad restore used to fail every tick
        await rem.stop()
        return rem

    return asyncio.run(go())


@pytest.mark.parametrize("state", WRONG_INSIDE, ids=lambda s: json.dumps(s)[:60])
def test_a_state_file_wrong_inside_is_set_aside_and_the_agent_starts(
    tmp_path: Path, state: dict[str, object]
) -> None:
    rem = _start(tmp_path, json.dumps(state).encode())
    assert rem.driver.ladders == {} and rem.restorer.pending == {}
    assert rem.state_file.set_aside_count == 1
    assert json.loads((tmp_path / "remediation-state.json.corrupt").read_bytes()) == state
    assert rem.status()["state_files_set_aside"] == 1
    got = rem.ctx.store.latest(SeriesKey.of("kcops_state_files_set_aside_total", {}))
    assert got is not None and got[1] == 1


def test_non_finite_numbers_in_state_are_set_aside(tmp_path: Path) -> None:
    for text in (b'{"version": 1, "ended": {"a": NaN}}', b'{"version": 1, "ended": {"a": 1e999}}'):
        rem = _start(tmp_path, text)
        assert rem.state_file.set_aside_count == 1 and rem.driver.ended == {}


def test_a_good_state_file_is_rebuilt_whole(tmp_path: Path) -> None:
    rem = _start(tmp_path, json.dumps(GOOD_STATE).encode())
    assert rem.state_file.set_aside_count == 0
    assert set(rem.driver.ladders) == {"KcopsOOM"}  # held: unconfirmed until the rules catch up
    assert rem.driver.ended["KcopsHot"] == 50.0 and rem.replicas.desired == 2
    assert rem.guards.cooldown_until == {"notify|engine": 400.0}
    assert rem.addressed.where == {"KcopsOOM": {"alertmanager:abc": "here"}}  # kept, typed
    saved = read_state(tmp_path / "remediation-state.json")  # written back by stop()
    assert saved["guards"]["runs"] == [(100.0, "notify")]


def _leaves(obj: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    if isinstance(obj, dict):
        return [path] + [p for k, v in obj.items() for p in _leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [path] + [p for i, v in enumerate(obj) for p in _leaves(v, (*path, i))]
    return [path]


def _replace(obj: Any, path: tuple[Any, ...], value: object) -> Any:
    if not path:
        return value
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(where=st.sampled_from(_leaves(GOOD_STATE)), value=json_values)
def test_any_value_anywhere_in_the_state_file_never_stops_the_agent(
    where: tuple[object, ...], value: object
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        text = json.dumps(_replace(GOOD_STATE, where, value)).encode()
        rem = _start(Path(tmp), text)  # starts, ticks and stops without raising
        assert rem.state_file.set_aside_count in (0, 1)


def test_leftover_temp_files_are_removed(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    (tmp_path / ".state.json.12345.tmp").write_text("{half")
    StateFile(path).save({"version": 1})
    read_state(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


WRITER = r"""
import sys
from pathlib import Path
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.records import parse_record
from kcops.agent.remediation.statefile import StateFile
d = Path(sys.argv[1])
state = StateFile(d / "state.json")
log = AuditLog(d / "audit.jsonl")
i = 0
while True:
    log.append(parse_record({"ts": float(i), "n": i, "pad": "x" * (i % 500)}))  # durable: no loop
    state.save({"version": 1, "ended": {"n": float(i)}})
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


def test_an_older_snapshot_written_late_never_replaces_a_newer_one(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "state.json")

    async def body() -> None:
        late = asyncio.create_task(sf.save_async({"version": 1, "ended": {"old": 1.0}}))
        await asyncio.sleep(0)  # the thread write of the old snapshot is under way (or not yet)
        sf.save({"version": 1, "ended": {"new": 2.0}})  # on the loop, a newer snapshot
        await late

    for _ in range(20):
        asyncio.run(body())
        assert read_state(tmp_path / "state.json")["ended"] == {"new": 2.0}
        assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # no temp left
