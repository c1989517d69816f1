"""A slow disk never freezes the real agent: every fsync delayed 2 s by strace's fault
injection (as on a throttled network volume) while actions run.

Each action is on disk before it acts (its started record and the guard state it spent)
or refused as not durable; no fsync runs on the thread of the agent's event loop (strace
says which thread made each one), so the loop never waits for the disk; and every record
an answer acknowledged is in the log afterwards. ``/healthz``'s worst answer is printed,
not asserted: on a shared 2-core box a busy neighbour moves it as much as a defect would.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcops.agent.remediation.auditread import read_audit
from tests.faults.conftest import RealAgent, start_agent, stop_agent
from tests.faults.test_audit_disk import enforcing, post_run, webhook
from tests.faults.test_loop_stall import HealthProbe

pytestmark = pytest.mark.slow
DELAY_US = 2_000_000
SYNC = re.compile(r"^(\d+)\s+(?:<\.\.\. )?f(?:data)?sync\b")


@contextlib.contextmanager
def slow_fsync(pid: int, log: Path) -> Iterator[None]:
    """Every fsync and fdatasync of ``pid``'s threads returns 2 s late (strace -f), each
    one written to ``log`` with the id of the thread that made it."""
    if shutil.which("strace") is None:
        pytest.fail("strace is missing: `make services` installs it")
    proc = subprocess.Popen(
        ["strace", "-f", "-qq", "-o", str(log), "-e", "trace=fsync,fdatasync",
         "-e", f"inject=fsync,fdatasync:delay_exit={DELAY_US}", "-p", str(pid)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    time.sleep(1.0)  # attached to every thread
    if proc.poll() is not None:
        err = proc.stderr.read().decode() if proc.stderr else ""
        pytest.fail(f"strace could not attach to the agent: {err[-500:]}")
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(30)


def syncing_threads(log: Path) -> set[int]:
    """The thread ids that called fsync or fdatasync, from strace's log."""
    return {int(m[1]) for line in log.read_text().splitlines() if (m := SYNC.match(line))}


def assert_off_the_loop(agent: RealAgent, log: Path) -> None:
    """The agent's loop runs on its main thread, whose id is the process id."""
    threads = syncing_threads(log)
    assert threads, "no fsync seen: the test no longer exercises the disk"
    assert agent.proc.pid not in threads, "an fsync ran on the event loop's thread"


def test_every_fsync_2s_late_never_freezes_the_agent(tmp_path: Path) -> None:
    with webhook(0.0) as url:
        extra = enforcing(url)
        extra["actions"]["guards"]["durable_wait_s"] = 20.0  # type: ignore[index]
        agent: RealAgent = start_agent(tmp_path, extra=extra)
        try:
            with (
                slow_fsync(agent.proc.pid, tmp_path / "strace.log"),
                HealthProbe(agent.url) as probe,
            ):
                t0 = time.monotonic()
                answers = [post_run(agent, n) for n in range(3)]  # one target: one at a time
                took = time.monotonic() - t0
            worst, seen = probe.worst, probe.answers
        finally:
            stop_agent(agent)
    print(
        f"\nfsync 2 s late: /healthz worst {worst:.3f} s over {seen} answers; 3 actions "
        f"answered {[r.status_code for r in answers]} in {took:.1f} s"
    )
    assert_off_the_loop(agent, tmp_path / "strace.log")
    acked = {r.json()["run_id"] for r in answers if r.status_code == 200}
    assert acked, "no action got through a slow disk within durable_wait_s"
    for r in answers:
        assert r.status_code in (200, 503), r.text[:300]
    recs = list(read_audit(agent.state_dir / "audit.jsonl"))
    started = {r["run_id"] for r in recs if r["kind"] == "started"}
    outcomes = {r["run_id"]: r["outcome"] for r in recs if r["kind"] == "action"}
    assert acked <= started, "an acknowledged run acted with no started record on disk"
    assert all(outcomes.get(rid) == "ok" for rid in acked), outcomes


def test_past_its_bound_an_action_is_refused_not_durable_and_spends_nothing(
    tmp_path: Path,
) -> None:
    with webhook(0.0) as url:
        extra = enforcing(url)
        extra["actions"]["guards"]["durable_wait_s"] = 1.0  # type: ignore[index]
        agent = start_agent(tmp_path, extra=extra)
        try:
            with slow_fsync(agent.proc.pid, tmp_path / "strace.log"):
                r = post_run(agent, 0)
        finally:
            stop_agent(agent)
    assert_off_the_loop(agent, tmp_path / "strace.log")
    assert r.status_code == 503, r.text[:300]
    body = r.json()
    assert body["error"].startswith("not durable:"), body
    assert body["record"]["outcome"] == "skipped_not_durable"
    assert body["record"]["refusal"] == "not_durable"
