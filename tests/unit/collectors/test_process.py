from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcops.agent.collectors import cgroup
from kcops.agent.collectors.cpumem import CpuDeviceMemoryCollector
from kcops.agent.collectors.process import EngineEventsCollector, ProcessCollector
from kcops.agent.collectors.procwatch import EngineWatch
from kcops.agent.engine.pid import EnginePid
from kcops.errors import CollectorUnavailable
from tests.unit.collectors.helpers import collect, latest, need, runner, value

ENGINE = {"process": "engine"}


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield p
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def fake_cgroup(tmp: Path, pid: int, limit: str = "max", oom_kill: int = 0) -> tuple[Path, Path]:
    proc = tmp / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text("0::/kubepods/engine\n")
    root = tmp / "cgroup"
    d = root / "kubepods" / "engine"
    d.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    (root / "kubepods" / "memory.max").write_text("max\n")
    (d / "memory.max").write_text(limit + "\n")
    set_oom(root, oom_kill)
    return proc, root


def set_oom(root: Path, n: int) -> None:
    (root / "kubepods" / "engine" / "memory.events").write_text(
        f"low 0\nhigh 0\nmax 3\noom {n}\noom_kill {n}\noom_group_kill 0\n"
    )


def kill_and_reap(p: subprocess.Popen) -> None:
    p.send_signal(signal.SIGKILL)
    p.wait()


def test_tree_resources_of_a_configured_pid(child: subprocess.Popen) -> None:
    watch = EngineWatch(EnginePid(pid=child.pid), kmsg_path=None)
    out = collect(ProcessCollector(watch), 1.0)
    assert need(out, "kcops_process_resident_memory_bytes", **ENGINE) > 1 << 20
    assert need(out, "kcops_process_threads", **ENGINE) >= 1
    assert need(out, "kcops_process_open_fds", **ENGINE) >= 3
    assert need(out, "kcops_process_cpu_seconds_total", **ENGINE) >= 0
    ev = collect(EngineEventsCollector(watch), 1.0)
    assert value(ev, "kcops_process_up", **ENGINE) == 1
    assert value(ev, "kcops_engine_oom_total") == 0


def test_children_are_part_of_the_tree_and_cpu_stays_monotonic() -> None:
    busy = "x=0\\nfor i in range(3*10**6): x+=i"
    code = (
        "import subprocess,sys,time; "
        f"c=subprocess.Popen([sys.executable,'-c','{busy}']); c.wait(); time.sleep(60)"
    )
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        watch = EngineWatch(EnginePid(pid=p.pid), kmsg_path=None, children_every=1)
        seen = []
        for i in range(200):
            snap = watch.observe(float(i))
            assert snap is not None
            seen.append((len(snap.pids), snap.cpu_seconds))
            if len(seen) > 3 and seen[-1][0] == 1 and max(n for n, _ in seen) == 2:
                break
            time.sleep(0.02)
        assert max(n for n, _ in seen) == 2  # the child was counted
        cpus = [c for _, c in seen]
        assert cpus == sorted(cpus)  # the exited child's CPU time was kept
    finally:
        p.kill()
        p.wait()


def test_pid_that_disappears_is_counted_and_engine_events_keep_reporting(
    child: subprocess.Popen,
) -> None:
    watch = EngineWatch(EnginePid(pid=child.pid), kmsg_path=None)
    r, store = runner(ProcessCollector(watch), EngineEventsCollector(watch))
    asyncio.run(r.tick(1.0))
    kill_and_reap(child)
    asyncio.run(r.tick(2.0))
    asyncio.run(r.tick(3.0))
    assert (
        latest(store, "kcops_collector_errors_total", collector="process", reason="process_gone")
        == 2
    )
    assert latest(store, "kcops_process_resident_memory_bytes", **ENGINE) is None  # stale, not 0
    assert latest(store, "kcops_process_up", **ENGINE) == 0
    assert latest(store, "kcops_engine_oom_total") == 0  # killed, but no evidence of OOM
    assert "gone" in (r.health["process"].last_error or "")


def test_oom_kill_recorded_by_the_cgroup_counts(tmp_path: Path, child: subprocess.Popen) -> None:
    proc, root = fake_cgroup(tmp_path, child.pid)
    watch = EngineWatch(EnginePid(pid=child.pid), proc_root=proc, cgroup_root=root, kmsg_path=None)
    ev = EngineEventsCollector(watch)
    collect(ev, 1.0)
    set_oom(root, 1)
    kill_and_reap(child)
    out = collect(ev, 2.0)
    assert value(out, "kcops_engine_oom_total") == 1
    assert watch.exits[-1].evidence == "cgroup oom_kill"
    assert value(collect(ev, 3.0), "kcops_engine_oom_total") == 1


def test_oom_kill_seen_one_read_before_the_exit_still_matches(
    tmp_path: Path, child: subprocess.Popen
) -> None:
    proc, root = fake_cgroup(tmp_path, child.pid)
    watch = EngineWatch(EnginePid(pid=child.pid), proc_root=proc, cgroup_root=root, kmsg_path=None)
    watch.observe(1.0)
    set_oom(root, 1)  # the kill is recorded while the process still shows up
    watch.observe(2.0)
    kill_and_reap(child)
    watch.observe(3.0)
    assert watch.oom_total == 1


def test_engine_log_oom_error_counts_but_old_lines_do_not(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("earlier run: MemoryError\n")
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)
    ]
    pid = {"now": procs[0].pid}
    try:
        watch = EngineWatch(
            EnginePid(supervisor_pid=lambda: pid["now"]), log_path=log, kmsg_path=None
        )
        watch.observe(1.0)
        kill_and_reap(procs[0])  # no new log line: not an OOM
        watch.observe(2.0)
        assert watch.oom_total == 0
        pid["now"] = procs[1].pid
        watch.observe(3.0)
        with log.open("a") as fh:
            fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        kill_and_reap(procs[1])
        watch.observe(4.0)
        assert watch.oom_total == 1 and watch.exits[-1].evidence == "engine log"
        assert watch.pids.supervised()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_restarts_seen_for_an_unsupervised_engine(tmp_path: Path) -> None:
    pidfile = tmp_path / "engine.pid"
    procs = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)
    ]
    try:
        pidfile.write_text(f"{procs[0].pid}\n")
        watch = EngineWatch(EnginePid(pidfile=pidfile), kmsg_path=None)
        ev = EngineEventsCollector(watch)
        assert value(collect(ev, 1.0), "kcops_engine_restarts_total") == 0
        kill_and_reap(procs[0])
        pidfile.write_text(f"{procs[1].pid}\n")
        out = collect(ev, 2.0)
        assert value(out, "kcops_engine_restarts_total") == 1
        assert value(out, "kcops_process_up", **ENGINE) == 1
        assert watch.exits[-1].pid == procs[0].pid
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def test_no_pid_known_is_an_error_only_when_one_was_configured(tmp_path: Path) -> None:
    w = EngineWatch(EnginePid(pidfile=tmp_path / "missing.pid"), kmsg_path=None)
    with pytest.raises(CollectorUnavailable) as info:
        collect(ProcessCollector(w))
    assert info.value.reason == "no_pid"
    # only the kcops worker's /admin/state may tell later: quiet, no samples
    w2 = EngineWatch(EnginePid(), kmsg_path=None)
    assert collect(ProcessCollector(w2)) == []
    assert collect(EngineEventsCollector(w2)) == []


def test_cpu_device_memory_uses_cgroup_limit_then_config_then_host(
    tmp_path: Path, child: subprocess.Popen
) -> None:
    proc, root = fake_cgroup(tmp_path, child.pid, limit=str(2 << 30))
    watch = EngineWatch(EnginePid(pid=child.pid), proc_root=proc, cgroup_root=root, kmsg_path=None)
    c = CpuDeviceMemoryCollector(watch, limit_bytes=1 << 30, host_total=lambda: 64 << 30)
    out = collect(c, 1.0)
    cpu = {"device": "cpu"}
    assert value(out, "kcops_device_memory_total_bytes", **cpu) == 2 << 30
    assert need(out, "kcops_device_memory_used_bytes", **cpu) > 1 << 20
    assert c.limit_source == "cgroup"
    (root / "kubepods" / "engine" / "memory.max").write_text("max\n")
    assert value(collect(c, 100.0), "kcops_device_memory_total_bytes", **cpu) == 1 << 30
    assert c.limit_source == "config"
    c.limit_bytes = None
    assert value(collect(c, 200.0), "kcops_device_memory_total_bytes", **cpu) == 64 << 30
    assert c.limit_source == "host"


def test_cgroup_tightest_ancestor_limit_and_v1(tmp_path: Path) -> None:
    proc, root = fake_cgroup(tmp_path, 7, limit="max")
    (root / "kubepods" / "memory.max").write_text(f"{3 << 30}\n")
    assert cgroup.memory_limit_bytes(cgroup.find(7, proc, root)) == 3 << 30
    assert cgroup.oom_kills(cgroup.find(7, proc, root)) == 0
    # cgroup v1 memory controller, path not present under the mount: the mount root is used
    v1proc = tmp_path / "p1"
    (v1proc / "8").mkdir(parents=True)
    (v1proc / "8" / "cgroup").write_text("4:memory:/docker/abc\n0::/\n")
    v1 = tmp_path / "c1" / "memory"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{5 << 30}\n")
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    cg = cgroup.find(8, v1proc, tmp_path / "c1")
    assert cgroup.memory_limit_bytes(cg) == 5 << 30
    assert cgroup.oom_kills(cg) == 4
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup.memory_limit_bytes(cg) is None


def test_this_host_cgroup_is_readable() -> None:
    cg = cgroup.find(os.getpid())
    # whatever the host has, reading it must not raise
    cgroup.memory_limit_bytes(cg)
    cgroup.oom_kills(cg)


def test_a_sigkill_without_oom_evidence_is_a_kill_not_an_oom(child: subprocess.Popen) -> None:
    """Issue 11: no cgroup oom_kill, no kernel record, no engine log line: not an OOM."""
    watch = EngineWatch(
        EnginePid(supervisor_pid=lambda: child.pid if child.poll() is None else None),
        kmsg_path=None,
    )
    ev = EngineEventsCollector(watch)
    collect(ev, 1.0)
    kill_and_reap(child)  # SIGKILL
    for t in (2.0, 3.0, 4.0):
        assert value(collect(ev, t), "kcops_engine_oom_total") == 0
    assert watch.exits[-1].oom is False and watch.exits[-1].evidence == ""
