"""Held probe connections and exhausted file descriptors, against a real agent (issue 24,
classes 3 and 4).

- 300 connections that sent part of a frame, held open (more than ``max_connections``,
  256): a good frame on a new connection is still counted within 5 s. Before, the
  connection limit stayed full and the engine's frames were refused for as long as
  the connections were held.
- The agent's ``RLIMIT_NOFILE`` lowered to a few dozen descriptors above what it uses,
  then probe and HTTP connections held until its accepts fail: its CPU <= 20% and its
  log <= 1 MB a minute while it lasts, and normal service once they are released.
  Before, the probe socket's failed accept was retried at once for ever: 100% CPU and
  over 100 MB of log in ten seconds.

Each test prints what it measured.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest

from kcops.kernels import wire
from tests.faults.conftest import RealAgent, start_agent, stop_agent
from tests.services import unix_connect, wait_until

pytestmark = pytest.mark.slow

HELD = 300
GOOD_WITHIN_S = 5.0
SPARE_FDS = 24  # descriptors left to the agent above what it uses when idle
EXHAUSTED_S = 10.0
MAX_CPU = 0.20
MAX_LOG_BYTES_PER_MIN = 1 << 20


def _frame(seq: int) -> bytes:
    return wire.encode(wire.Frame(pid=4242, process="engine", seq=seq, calls_by_layer={"0": 1}))


def _metric(agent: RealAgent, series: str) -> float:
    for line in httpx.get(agent.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return 0.0


def _ok_frames(agent: RealAgent) -> float:
    return _metric(agent, 'kcops_probe_frames_total{outcome="ok"}')


@pytest.fixture
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealAgent]:
    a = start_agent(tmp_path_factory.mktemp("held"))
    try:
        yield a
    finally:
        stop_agent(a)
    assert "Traceback" not in a.log.read_text(), a.log.read_text()[-3000:]


def test_300_half_sent_connections_held_and_a_good_frame_is_still_counted(
    agent: RealAgent,
) -> None:
    held = [unix_connect(agent.probe_socket, _frame(0)[:20]) for _ in range(HELD)]
    try:
        wait_until(
            lambda: _metric(agent, "kcops_probe_connections_open") >= 256, 30, "the limit full"
        )
        before = _ok_frames(agent)
        t0 = time.monotonic()
        with unix_connect(agent.probe_socket, _frame(1)):
            wait_until(lambda: _ok_frames(agent) > before, 30, "the good frame counted")
            took = time.monotonic() - t0
        evicted = _metric(agent, 'kcops_probe_connections_total{outcome="evicted"}')
        refused = _metric(agent, 'kcops_probe_connections_total{outcome="refused"}')
        print(
            f"\n{HELD} half-sent connections held: a good frame on a new connection counted "
            f"in {took:.3f} s (goal <= {GOOD_WITHIN_S:.0f} s); evicted {evicted:.0f}, "
            f"refused {refused:.0f}, open {_metric(agent, 'kcops_probe_connections_open'):.0f}"
        )
        assert took <= GOOD_WITHIN_S
        # Some of the 300 came while every connection had bytes waiting (read every
        # 25 ms): those were refused, none of the waiting ones closed for them.
        assert evicted >= 1
    finally:
        for c in held:
            c.close()


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_fd_exhaustion_costs_little_cpu_and_log_and_service_returns(agent: RealAgent) -> None:
    pid = agent.proc.pid
    proc = psutil.Process(pid)
    wait_until(lambda: _ok_frames(agent) == 0 and True, 10, "the agent up")
    limit = _fds(pid) + SPARE_FDS
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    port = int(agent.url.rsplit(":", 1)[1])
    held: list[socket.socket] = []
    try:
        # Probe connections until the agent's accepts fail: the socket's backlog fills.
        for _ in range(SPARE_FDS + 100):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.setblocking(False)
            try:
                c.connect(str(agent.probe_socket))
            except BlockingIOError:  # the backlog is full: nothing accepts any more
                c.close()
                break
            held.append(c)
        # and HTTP connections, which the control API's accept cannot take either
        for _ in range(20):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(1.0)
        assert _fds(pid) >= limit - 2, (_fds(pid), limit)  # it really ran out
        cpu0, log0, t0 = proc.cpu_times(), agent.log.stat().st_size, time.monotonic()
        time.sleep(EXHAUSTED_S)
        cpu1, log1, t1 = proc.cpu_times(), agent.log.stat().st_size, time.monotonic()
        cpu = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / (t1 - t0)
        log_per_min = (log1 - log0) * 60 / (t1 - t0)
    finally:
        for c in held:
            c.close()
    t_release = time.monotonic()
    wait_until(
        lambda: httpx.get(agent.url + "/healthz", timeout=2).status_code == 200,
        30, "/healthz once the connections are released",
    )  # fmt: skip
    healthz_s = time.monotonic() - t_release
    with unix_connect(agent.probe_socket, _frame(7)):
        wait_until(lambda: _ok_frames(agent) >= 1, 30, "a good frame counted after")
    errors = _metric(agent, 'kcops_collector_errors_total{collector="probe",reason="accept"}')
    http_errors = _metric(agent, 'kcops_collector_errors_total{collector="http",reason="accept"}')
    print(
        f"\nfd exhaustion (RLIMIT_NOFILE {limit}, {len(held)} connections held, "
        f"{t1 - t0:.1f} s): agent CPU {cpu:.1%} (goal <= {MAX_CPU:.0%}), log "
        f"{log_per_min / 1024:.1f} KiB/min (goal <= 1 MiB/min); failed accepts counted: "
        f"probe {errors:.0f}, http {http_errors:.0f}; /healthz 200 {healthz_s:.2f} s after "
        f"release, and a good frame counted"
    )
    assert cpu <= MAX_CPU
    assert log_per_min <= MAX_LOG_BYTES_PER_MIN
    assert errors >= 1
