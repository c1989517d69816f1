"""The audit log: strict JSON, torn lines recovered on reading, started records before a
run acts (and interrupted ones after a kill), repeats summed up, outcomes as they were."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Check,
    NoParams,
    Registry,
)
from kcops.agent.actions.fallback_to_base import SPEC as FALLBACK
from kcops.agent.events import Step
from kcops.agent.outcome import ActionName, ActionRejected, Outcome, Refusal
from kcops.agent.remediation import audit as audit_mod
from kcops.agent.remediation import ladder as L
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.auditread import ReadStats, read_audit
from kcops.agent.remediation.records import ActionRecord, Trigger, parse_record
from kcops.agent.remediation.remediation import Remediation
from tests.clock import ManualClock
from tests.unit.actions.fakeworker import TOKEN
from tests.unit.actions.harness import make_ctx, make_rem, unsynced

NONFINITE = (b"NaN", b"Infinity")


def test_non_finite_numbers_are_written_as_null_and_named(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "a.jsonl")
    nan, inf = float("nan"), float("inf")
    log.append(
        ActionRecord(
            ts=1.0, run_id="r", action="evict_cache", params={}, target="engine", mode="enforce",
            outcome=Outcome.OK, duration_s=nan, before={"x": [1.0, -inf]}, after={"h": inf},
        )
    )  # fmt: skip
    log.close()
    raw = (tmp_path / "a.jsonl").read_bytes()
    assert not any(t in raw for t in NONFINITE), raw
    rec = json.loads(raw)
    assert rec["duration_s"] is None and rec["before"] == {"x": [1.0, None]}
    assert rec["after"] == {"h": None}
    assert rec["nonfinite"] == ["duration_s", "before.x[1]", "after.h"]


def test_hold_s_infinity_is_refused_naming_what_is_allowed() -> None:
    for bad in (float("inf"), float("nan")):
        with pytest.raises(ActionRejected) as exc:
            FALLBACK.parse({"hold_s": bad})
        assert exc.value.reason == Refusal.INVALID
        assert "hold_s" in str(exc.value) and "finite number" in str(exc.value)
    assert FALLBACK.parse({"hold_s": 30.0}).model_dump() == {"hold_s": 30.0}


def test_a_record_glued_to_a_torn_fragment_is_recovered_anywhere(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(
        b'{"ts":1,"n":1}\n'
        b'{"ts":2,"n":2,"tr{"ts":3,"n":3}\n'  # old agents glued the next record to a fragment
        b"garbage\n"
        b'{"ts":4,"n":4}\n'
    )
    stats = ReadStats()
    assert [r["n"] for r in read_audit(path, stats=stats)] == [1, 3, 4]
    assert (stats.invalid, stats.recovered) == (1, 1)


def test_a_failed_write_leaves_no_fragment_and_is_written_later_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short write and then ENOSPC: the part that landed is cut back, the record held;
    once the disk takes it, it is written once, before the newer ones."""
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    log.append(parse_record({"ts": 1.0, "n": 1}))
    real_write = os.write
    calls = {"n": 0}

    def full(fd: int, data: bytes) -> int:
        if fd != log._fd:  # only the log's writes fail
            return real_write(fd, data)
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data[:7]))  # short write
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(audit_mod.os, "write", full)
    assert log.append(parse_record({"ts": 2.0, "n": 2})) is not None  # kept, in memory
    log.append(parse_record({"ts": 3.0, "n": 3}))
    assert path.read_bytes() == b'{"n":1,"ts":1.0}\n'  # no fragment left
    assert log.held == 2 and log.write_errors >= 1

    async def not_acknowledged() -> bool:
        return await log.sync()

    assert asyncio.run(not_acknowledged()) is False
    monkeypatch.setattr(audit_mod.os, "write", real_write)
    log.tick(10.0)
    log.append(parse_record({"ts": 4.0, "n": 4}))
    assert asyncio.run(not_acknowledged()) is True
    log.close()
    assert [r["n"] for r in read_audit(path)] == [1, 2, 3, 4]
    assert path.read_bytes().count(b"\n") == 4


def test_a_fragment_that_could_not_be_cut_back_is_ended_before_the_next_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    log.append(parse_record({"ts": 1.0, "n": 1}))
    real_write = os.write

    def torn(fd: int, data: bytes) -> int:
        if fd != log._fd:
            return real_write(fd, data)
        real_write(fd, bytes(data[:6]))
        raise OSError(errno.EIO, "I/O error")

    real_truncate = os.ftruncate

    def no_truncate(fd: int, size: int) -> None:
        if fd != log._fd:
            return real_truncate(fd, size)
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(audit_mod.os, "write", torn)
    monkeypatch.setattr(audit_mod.os, "ftruncate", no_truncate)
    log.append(parse_record({"ts": 2.0, "n": 2}))
    monkeypatch.undo()
    log.tick(3.0)
    log.close()
    lines = path.read_bytes().splitlines()
    assert lines[1] == b'{"n":2'  # the fragment, on a line of its own
    assert [r["n"] for r in read_audit(path)] == [1, 2]


# -- through the runner ---------------------------------------------------------


# The test action's name: an action's own (a record names a known action), in a registry
# that holds only the gate.
GATE = ActionName.NOTIFY


class Gate:
    """A test action: refused as ``starting`` while ``starting``; else acts, once ``go``."""

    def __init__(self, path: Path) -> None:
        self.starting = False
        self.path = path
        self.seen_started: list[str] = []
        self.go = asyncio.Event()

    def precheck(self, check: Check, _: NoParams) -> None:
        if self.starting:
            raise ActionRejected("the engine is still starting", Refusal.STARTING)

    async def act(self, ctx: ActionContext, _: NoParams) -> ActionResult:
        kinds = [str(r["kind"]) for r in read_audit(self.path)]
        self.seen_started.append(kinds[-1])
        await self.go.wait()
        return ActionResult(detail="done")


async def _rem(tmp: Path, gate: Gate, **guards: float) -> tuple[Remediation, ManualClock]:
    os.environ["KCOPS_TOKEN"] = TOKEN
    clock = ManualClock(1000.0)
    ctx, _ = make_ctx(tmp, None, clock, mode="enforce", guards={"cooldown_s": 0, **guards})
    reg = Registry()
    reg.register(ActionSpec(GATE, gate.act, NoParams, "test", precheck=gate.precheck))
    return await make_rem(ctx, reg), clock


def test_started_is_on_disk_before_the_run_acts_and_a_kill_leaves_it_interrupted(
    tmp_path: Path,
) -> None:
    killed = tmp_path / "killed"

    async def body() -> None:
        gate = Gate(tmp_path / "audit.jsonl")
        rem, _ = await _rem(tmp_path, gate)
        run = rem.runner.submit(GATE, {}, trigger=Trigger(source="api"))
        while not gate.seen_started:
            await asyncio.sleep(0.01)
        assert unsynced(rem.audit) == 0  # durable before it acted
        shutil.copytree(tmp_path, killed, ignore=shutil.ignore_patterns("killed"))  # kill -9
        gate.go.set()
        assert run.task is not None
        await run.task
        await rem.stop()
        assert gate.seen_started == ["started"]

        gate2 = Gate(killed / "audit.jsonl")
        rem2, _ = await _rem(killed, gate2)
        await rem2.stop()
        recs: list[Any] = list(read_audit(killed / "audit.jsonl"))
        started = [r for r in recs if r["kind"] == "started"]
        assert [r["action"] for r in started] == [GATE]
        ends = [r for r in recs if r["kind"] == "action"]
        assert [(r["run_id"], r["outcome"]) for r in ends] == [
            (started[0]["run_id"], "interrupted")
        ]
        assert "may have acted" in ends[0]["error"]

    asyncio.run(body())


def test_a_slow_disk_holds_an_action_back_to_its_bound_then_refuses_it_spending_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saturated disk's fsync can take many seconds: the action waits (the loop does
    not) for its started record and the guard state it spent to be on disk; past
    actions.guards.durable_wait_s it does not act (skipped_not_durable: its ladder tries
    again) and gives back its budget. Once the disk answers, the next run acts."""
    import threading

    disk = threading.Event()
    real = AuditLog._fsync

    def slow_fsync(self: AuditLog) -> bool:
        disk.wait(30)  # the disk answers when the test says so
        return real(self)

    async def body() -> None:
        gate = Gate(tmp_path / "audit.jsonl")
        gate.go.set()
        rem, _ = await _rem(tmp_path, gate, cooldown_s=60, durable_wait_s=0.3)
        monkeypatch.setattr(AuditLog, "_fsync", slow_fsync)
        beats = 0

        async def loop_goes_on() -> None:
            nonlocal beats
            while True:
                await asyncio.sleep(0.01)
                beats += 1

        beat = asyncio.ensure_future(loop_goes_on())
        run = rem.runner.submit(GATE, {}, trigger=Trigger(source="api"))
        assert run.task is not None
        await run.task
        beat.cancel()
        assert (run.outcome, run.refusal) == ("skipped_not_durable", "not_durable"), run.error
        assert "did not reach the disk within 0.3s" in (run.error or "")
        assert gate.seen_started == []  # it never acted
        assert beats >= 10  # the loop was never held by the disk
        assert rem.guards.runs == [] and rem.guards.cooldown_until == {}  # nothing spent
        disk.set()
        again = rem.runner.submit(GATE, {}, trigger=Trigger(source="api"))
        assert again.task is not None
        await again.task
        assert again.outcome == "ok" and gate.seen_started == ["started"]
        await rem.stop()

    try:
        asyncio.run(body())
    finally:
        disk.set()


def test_a_refusal_repeated_while_its_cause_lasts_is_recorded_once_with_a_count(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        gate = Gate(tmp_path / "audit.jsonl")
        gate.go.set()
        rem, clock = await _rem(tmp_path, gate)
        gate.starting = True
        trig = Trigger(alertname="KcopsOOM", resolved_since=900.0, hold_s=60.0)
        for _ in range(150):  # a restore asked each second while the engine starts
            run = rem.runner.submit(GATE, {}, trigger=trig, force=True, reason="restore")
            assert run.outcome == Outcome.SKIPPED_STARTING
            await rem.tick(clock())
            clock.advance(1.0)
        gate.starting = False
        run = rem.runner.submit(GATE, {}, trigger=trig, force=True, reason="restore")
        assert run.task is not None
        await run.task
        for _ in range(3):  # refused again, then quiet: the repeat ends
            gate.starting = True
            rem.runner.submit(GATE, {}, trigger=trig, force=True, reason="restore")
            clock.advance(1.0)
        clock.advance(120.0)
        await rem.tick(clock())
        await rem.stop()
        recs: list[Any] = list(read_audit(tmp_path / "audit.jsonl"))
        shape = [(r["kind"], r.get("outcome") or r.get("count")) for r in recs]
        assert shape == [
            ("action", "skipped_starting"),
            ("repeated", 149),
            ("started", None),
            ("action", "ok"),
            ("action", "skipped_starting"),
            ("repeated", 2),
        ]
        rep = recs[1]
        assert rep["of"]["outcome"] == "skipped_starting" and rep["of"]["alertname"] == "KcopsOOM"
        assert rep["last_ts"] - rep["first_ts"] == 148.0 and rep["why"] == "changed"
        assert recs[-1]["why"] == "ended"
        assert rem.runner.counts[(GATE, Outcome.SKIPPED_STARTING)] == 153  # metrics count all

    asyncio.run(body())


# -- ladders: what ran, what was skipped --------------------------------------------


def _ladder(*actions: str) -> L.Ladder:
    trig = Trigger(alertname="KcopsEngineHung", labels={"severity": "page"})
    steps = tuple(Step(action=a, verify_s=30.0) for a in actions)
    return L.Ladder.new("KcopsEngineHung", steps, 0.0, trig)


def _drive(lad: L.Ladder, outcomes: list[Outcome]) -> list[L.Decision]:
    out: list[L.Decision] = []
    t = 0.0
    for o in outcomes:
        lad, ds = L.step(lad, L.Tick(t), retry_s=5.0)
        out += ds
        lad, ds = L.step(lad, L.Decided(t, o, "r", f"{o} because"), retry_s=5.0)
        out += ds
        t += 31.0
    lad, ds = L.step(lad, L.Tick(t), retry_s=5.0)
    out += ds
    lad, ds = L.step(lad, L.Tick(t), retry_s=5.0)
    return out + ds


def test_a_step_skipped_for_cooldown_is_not_audited_or_paged_as_run() -> None:
    # Refused for cooldown for a whole verify window (tried again meanwhile), then left.
    ds = _drive(_ladder("restart_worker"), [Outcome.SKIPPED_COOLDOWN] * 2)
    end = [d for d in ds if isinstance(d, L.Audit)][-1]
    assert end.event == "nothing_ran" and end.ran == ()
    assert end.skipped is not None and end.skipped[0].startswith("restart_worker (")
    assert "skipped_cooldown because" in end.skipped[0]
    page = next(d for d in ds if isinstance(d, L.Escalate))
    assert page.page and "no remediation ran" in page.message
    assert "restart_worker ran" not in page.message and "remediation ran (" not in page.message


def test_a_page_says_how_each_step_that_ran_ended() -> None:
    lad = _ladder("evict_cache", "fallback_to_base", "restart_worker")
    ds = _drive(
        lad, [Outcome.OK, Outcome.SKIPPED_COOLDOWN, Outcome.SKIPPED_COOLDOWN, Outcome.FAILED]
    )
    end = [d for d in ds if isinstance(d, L.Audit)][-1]
    assert end.event == "exhausted" and end.ran == ("evict_cache", "restart_worker")
    assert end.skipped is not None and len(end.skipped) == 1
    page = next(d for d in ds if isinstance(d, L.Escalate))
    assert "evict_cache ran; restart_worker ran and failed" in page.message
    assert "skipped: fallback_to_base" in page.message


def test_history_reads_the_new_kinds_and_skips_a_torn_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kcops.cli import cli

    now = 1_800_000_000.0
    lines = [
        json.dumps({"kind": "started", "ts": now, "run_id": "a-1", "action": "restart_worker"}),
        '{"kind":"action","ts":1800000001,"run_id":"a-1","act',  # torn by a full disk
        json.dumps({"kind": "action", "ts": now + 2, "run_id": "a-1", "action": "restart_worker",
                    "outcome": "interrupted", "error": "the agent stopped while it ran"}),
        json.dumps({"kind": "repeated", "ts": now + 150, "count": 149, "first_ts": now + 3,
                    "last_ts": now + 150, "why": "changed",
                    "of": {"action": "restore_route", "outcome": "skipped_starting"}}),
        json.dumps({"kind": "ladder", "ts": now + 151, "event": "nothing_ran", "alertname": "A",
                    "steps": ["restart_worker"], "ran": [],
                    "skipped": ["restart_worker (cooling down)"]}),
    ]  # fmt: skip
    (tmp_path / "audit.jsonl").write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(cli, ["actions", "history", "--state-dir", str(tmp_path)])
    assert res.exit_code == 0, res.output
    out = res.output.splitlines()
    assert len(out) == 4, out
    assert "restart_worker" in out[0] and "started" in out[0]
    assert "interrupted" in out[1]
    assert "repeated 149 more time(s) over 147s (changed): restore_route skipped_starting" in out[2]
    assert "nothing_ran" in out[3] and "skipped: restart_worker (cooling down)" in out[3]


def test_the_same_page_again_is_counted_not_written_again(tmp_path: Path) -> None:
    from kcops.agent.config.actions import NotifySection
    from kcops.agent.remediation.paging import Pager

    clock = ManualClock(1000.0)
    log = AuditLog(tmp_path / "a.jsonl")
    pager = Pager(NotifySection(), log, clock)
    for _ in range(50):
        pager.page("engine crash loop: exit 137", alertname="KcopsEngineDown")
        clock.advance(2.0)
    pager.page("engine back", alertname="KcopsEngineDown")
    log.close()
    recs: list[Any] = list(read_audit(tmp_path / "a.jsonl"))
    assert [(r["kind"], r.get("count")) for r in recs] == [
        ("page", None),
        ("repeated", 49),
        ("page", None),
    ]
    assert pager.sent == {"logged": 51} and pager.pages == 51  # every page still counted


def test_a_step_cooling_down_from_another_incident_runs_once_the_cooldown_allows() -> None:
    """KcopsEngineDown restarted the engine; seconds later it stalls: the stall ladder's
    restart_worker is refused for cooldown, tried again, and runs (it used to wait a
    verify window for a run that was not its own and leave the engine stalled)."""
    ds = _drive(_ladder("restart_worker"), [Outcome.SKIPPED_COOLDOWN, Outcome.OK])
    assert sum(isinstance(d, L.Submit) for d in ds) == 2
    page = next(d for d in ds if isinstance(d, L.Escalate))  # its own run not enough
    assert "restart_worker ran" in page.message and "no remediation ran" not in page.message
