"""Engine lifecycle (pure step, table) and the shared-memory cleanup after an engine's tree."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine import shm
from kcops.agent.engine.lifecycle import EngineState as S

CASES = [
    ("loading, failing checks: starting", S.STARTING, lc.Health(5, False, "connect"), S.STARTING),
    ("first healthy answer: ready", S.STARTING, lc.Health(5, True), S.READY),
    ("ready, check times out: hung", S.READY, lc.Health(5, False, "timeout"), S.HUNG),
    ("ready, connection refused: down", S.READY, lc.Health(5, False, "connect"), S.DOWN),
    ("hung answers again: ready", S.HUNG, lc.Health(5, True), S.READY),
    ("respawned: starting again", S.DOWN, lc.Spawned(5), S.STARTING),
    ("ready process exits: down", S.READY, lc.Exited(5), S.DOWN),
    ("exits while loading: starting", S.STARTING, lc.Exited(5), S.STARTING),
]  # fmt: skip


@pytest.mark.parametrize(("state", "ev", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_lifecycle_step(state: S, ev: lc.Event, want: S) -> None:
    before = lc.Lifecycle(state, 0.0, 0.0)
    after = lc.step(before, ev)
    assert after.state is want
    assert after.since == (0.0 if want is state else 5.0)


def test_health_collector_exports_the_state_one_hot_and_the_start_age() -> None:
    from kcops.agent.collectors.health import lifecycle_samples
    from kcops.agent.engine import Engine

    eng = Engine("http://127.0.0.1:9", "vllm", now=100.0, startup_timeout_s=600)
    got = {(s.name, dict(s.labels).get("state")): s.value for s in lifecycle_samples(eng, 160.0)}
    assert got[("kcops_engine_state", "starting")] == 1.0
    assert got[("kcops_engine_state", "ready")] == 0.0
    assert got[("kcops_engine_starting_seconds", None)] == 60.0
    assert got[("kcops_engine_startup_timeout_seconds", None)] == 600.0
    eng.observe(lc.Health(161.0, True))
    got = {(s.name, dict(s.labels).get("state")) for s in lifecycle_samples(eng, 162.0)}
    assert ("kcops_engine_starting_seconds", None) not in got


def test_shm_cleanup_removes_only_new_unused_entries(tmp_path: Path) -> None:
    root = tmp_path / "shm"
    root.mkdir()
    (root / "someone_elses").write_bytes(b"x")  # there before the engine started
    before = shm.snapshot(root)
    (root / "psm_left_by_engine").write_bytes(b"x" * 4096)
    (root / "psm_still_open").write_bytes(b"x")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys,time; f=open(sys.argv[1]); print('open', flush=True); time.sleep(60)",
            str(root / "psm_still_open"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        removed = shm.cleanup(before, root)
    finally:
        holder.kill()
        holder.wait()
    assert removed == ["psm_left_by_engine"]
    assert sorted(p.name for p in root.iterdir()) == ["psm_still_open", "someone_elses"]


def test_supervisor_records_a_sigkill_as_a_kill_not_an_oom() -> None:
    import asyncio
    import os
    import signal

    from kcops.agent.clock import ManualClock
    from kcops.agent.config.actions import RestartSection
    from kcops.agent.supervisor import Supervisor

    async def body() -> None:
        clock = ManualClock()
        sup = Supervisor(
            [sys.executable, "-c", "import time; time.sleep(60)"],
            RestartSection(backoff_initial_s=100),
            clock=clock,
        )
        await sup.start()
        try:
            pid = sup.pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # as the kernel or an operator would
            deadline = time.monotonic() + 30
            while sup.last_exit_info is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
                await sup.tick(clock.advance(0.1))
            info = sup.last_exit_info
            assert info is not None and info["signal"] == "SIGKILL"
            assert info["by_supervisor"] is False and "oom" not in info
            # backing off: the supervisor owns the next start, restart_worker must not
            assert sup.backing_off() is not None
        finally:
            await sup.stop()

    asyncio.run(body())
