"""Engine lifecycle: the pure step (table), what feeds it (health, spawns, restarts the
agent does not own), and what the engine says about its own drain on SIGTERM."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from kcops.agent.engine import lifecycle as lc
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
    ("ready, no progress: stalled", S.READY, lc.Stall(5, True), S.STALLED),
    ("stalled, answers health: still stalled", S.STALLED, lc.Health(5, True), S.STALLED),
    ("stalled, progress again: ready", S.STALLED, lc.Stall(5, False), S.READY),
    ("stalled, check times out: hung", S.STALLED, lc.Health(5, False, "timeout"), S.HUNG),
    ("stalled process exits: down", S.STALLED, lc.Exited(5), S.DOWN),
    ("stalled, respawned: starting", S.STALLED, lc.Spawned(5), S.STARTING),
    ("loading is never stalled", S.STARTING, lc.Stall(5, True), S.STARTING),
    ("hung is not stalled (health decides)", S.HUNG, lc.Stall(5, True), S.HUNG),
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


def test_supervisor_records_a_sigkill_as_a_kill_not_an_oom() -> None:
    import asyncio
    import os
    import signal

    from kcops.agent.config.actions import RestartSection
    from kcops.agent.engine.supervisor import Supervisor
    from tests.clock import ManualClock

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


TIMEOUTS = [
    ("space", ["vllm", "serve", "m", "--shutdown-timeout", "30"], 30),
    ("equals", ["vllm", "serve", "m", "--shutdown-timeout=45"], 45),
    ("absent", ["vllm", "serve", "m"], None),
    ("no value", ["vllm", "serve", "m", "--shutdown-timeout"], None),
    ("negative", ["vllm", "serve", "--shutdown-timeout", "-1"], None),
    ("not a number", ["vllm", "serve", "--shutdown-timeout", "ten"], None),
    ("fraction", ["vllm", "serve", "--shutdown-timeout", "1.5"], None),
    ("zero: abort", ["vllm", "serve", "--shutdown-timeout", "0"], 0),
    ("last one wins", ["x", "--shutdown-timeout", "10", "--shutdown-timeout=20"], 20),
    ("another flag", ["x", "--shutdown-timeout-s", "5"], None),
    ("past a day", ["x", "--shutdown-timeout", "86401"], None),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "want"), [c[1:] for c in TIMEOUTS], ids=[c[0] for c in TIMEOUTS])
def test_shutdown_timeout_from_the_command_line(argv: list[str], want: int | None) -> None:
    from kcops.agent.engine.kinds.vllm import shutdown_timeout_s

    assert shutdown_timeout_s(argv) == want


@pytest.mark.slow
def test_engine_drain_read_from_the_live_process_group() -> None:
    """A wrapper's child that says --shutdown-timeout counts: every member is read."""
    from kcops.agent.engine.shutdown import engine_drain_s

    p = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "--shutdown-timeout", "7"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while engine_drain_s(["sh", "run-engine.sh"], p.pid) != 7:
            assert time.monotonic() < deadline, "the child's command line was never read"
            time.sleep(0.02)
        assert engine_drain_s(["vllm", "serve", "--shutdown-timeout", "9"], p.pid) == 9
        assert engine_drain_s(["sh", "run-engine.sh"], None) == 0
    finally:
        p.kill()
        p.wait()


@pytest.mark.slow
def test_signal_restart_waits_the_engines_drain_and_records_a_new_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """restart_worker in signal mode: the grace covers the engine's own drain (no SIGKILL
    although grace_s alone is shorter), and the engine is starting again afterwards, so
    KcopsEngineDown does not count the reload and no action fires at it."""
    import asyncio

    from kcops.agent.actions.base import ActionContext, NoParams
    from kcops.agent.actions.restart_worker import restart_worker
    from kcops.agent.config import parse_config
    from kcops.agent.engine import Engine
    from kcops.agent.outcome import ActionRejected
    from tests.unit.actions.shmprog import holder_cmd

    log = tmp_path / "term.log"
    cmd = holder_cmd(tmp_path, "--term-delay", "1", "--term-log", str(log))
    p = subprocess.Popen([*cmd, "--shutdown-timeout", "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        cfg = parse_config(
            {
                "engine": {"url": "http://127.0.0.1:9", "adapter": "vllm", "pid": p.pid},
                "actions": {"restart": {"mode": "signal", "grace_s": 0.3}},
            }
        )
        engine = Engine(cfg.engine.url, "vllm", now=0.0)
        engine.observe(lc.Health(50.0, True))
        assert engine.state is S.READY
        ctx = ActionContext(config=cfg, engine=engine, target="engine", now=100.0)
        out = asyncio.run(restart_worker(ctx, NoParams()))
        assert out.data == {"killed": False, "grace_s": 3.3, "engine_drain_s": 3}
        assert log.read_text() == "root orphaned=False\n" and p.wait(10) == 0
        assert engine.state is S.STARTING and engine.lifecycle.started_at >= 100.0
        engine.observe(lc.Health(101.0, False, "connect"))  # reloading: not down
        assert engine.state is S.STARTING
        with pytest.raises(ActionRejected) as info:
            engine.not_starting()
        assert info.value.reason == "starting"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


@pytest.mark.slow
def test_a_restart_the_agent_did_not_make_is_a_new_start(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The engine's pidfile names a new process (a container restart, a process manager):
    the lifecycle goes back to starting instead of counting the reload as down."""
    from kcops.agent.collectors.process import EngineEventsCollector
    from kcops.agent.collectors.procwatch import EngineWatch
    from kcops.agent.engine import Engine
    from kcops.agent.engine.pid import EnginePid

    pidfile = tmp_path / "engine.pid"
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)
    ]
    try:
        pidfile.write_text(f"{procs[0].pid}\n")
        engine = Engine("http://127.0.0.1:9", "vllm", now=0.0)
        ev = EngineEventsCollector(EngineWatch(EnginePid(pidfile=pidfile), kmsg_path=None), engine)
        ev.collect(1.0)
        engine.observe(lc.Health(1.0, True))
        procs[0].kill()
        procs[0].wait()
        engine.observe(lc.Health(2.0, False, "connect"))
        assert engine.state is S.DOWN  # gone, and nothing says it restarts yet
        pidfile.write_text(f"{procs[1].pid}\n")
        ev.collect(3.0)
        assert engine.state is S.STARTING and engine.lifecycle.started_at == 3.0
        engine.observe(lc.Health(4.0, False, "connect"))
        assert engine.state is S.STARTING
        engine.observe(lc.Health(5.0, True))
        assert engine.state is S.READY
        ev.collect(6.0)  # same pid: nothing new
        assert engine.state is S.READY
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_the_agents_restart_lasts_from_its_start_until_the_engine_is_ready_again() -> None:
    """kcops_engine_restarting: 1 from the agent's own restart (still ready while it drains,
    down once killed, starting once respawned) until the new engine answers healthy, at
    most its startup timeout; the source of the restart's inhibitions."""
    from kcops.agent.collectors.health import lifecycle_samples
    from kcops.agent.engine import Engine

    eng = Engine("http://127.0.0.1:9", "vllm", now=0.0, startup_timeout_s=600)

    def restarting(now: float) -> float:
        (s,) = [s for s in lifecycle_samples(eng, now) if s.name == "kcops_engine_restarting"]
        return s.value

    eng.observe(lc.Health(1.0, True))
    assert eng.state is S.READY and restarting(1.0) == 0.0
    eng.observe(lc.Restarting(2.0))
    eng.observe(lc.Health(3.0, True))  # draining: still ready, still restarting
    assert restarting(3.0) == 1.0
    eng.observe(lc.Health(4.0, False, "connect"))  # killed
    assert eng.state is S.DOWN and restarting(4.0) == 1.0
    eng.observe(lc.Spawned(5.0))
    assert eng.state is S.STARTING and restarting(5.0) == 1.0
    assert restarting(603.0) == 0.0  # past the startup timeout: StartSlow's, not inhibited
    eng.observe(lc.Health(30.0, True))  # ready again: the restart is over
    assert eng.state is S.READY and restarting(30.0) == 0.0
    eng.observe(lc.Health(31.0, False, "connect"))  # a death of its own, no restart behind
    assert eng.state is S.DOWN and restarting(31.0) == 0.0
