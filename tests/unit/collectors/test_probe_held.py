"""Held probe connections cannot lock the engine out (issue 24, class 3), and a failing
accept is not a busy loop (class 4): over a real Unix stream socket, with the
receiver's clock in the test's hands."""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kcops.agent.collectors.probe import ProbeReceiver
from kcops.kernels import wire
from tests.unit.collectors.helpers import collect, value
from tests.unit.collectors.test_probe_stream import until


@pytest.fixture
def sock_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kch-", dir="/tmp") as d:  # AF_UNIX: short paths
        yield Path(d) / "probe.sock"


def _frame(seq: int) -> bytes:
    return wire.encode(wire.Frame(pid=1, process="p", seq=seq, calls_by_layer={"0": 1}))


def _connect(path: Path, data: bytes = b"") -> socket.socket:
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(str(path))
    if data:
        c.sendall(data)
    return c


def _closed_by_agent(c: socket.socket) -> bool:
    c.settimeout(5.0)
    try:
        return c.recv(1) == b""
    except ConnectionResetError:
        return True


def test_a_limit_full_of_silent_and_half_sent_connections_still_takes_a_good_frame(
    sock_path: Path,
) -> None:
    """Every place taken by connections that sent nothing or part of a frame: a new one is
    served, in the place of one that never delivered a frame (the oldest); the engine's
    connection, which did, is never the one closed."""
    r = ProbeReceiver(sock_path, max_connections=4, drain_interval_s=0.005)

    async def main() -> None:
        await r.start()
        engine = _connect(sock_path, _frame(0))
        await until(lambda: r.frames["ok"] == 1)
        silent = _connect(sock_path)
        half = [_connect(sock_path, _frame(1)[:20]) for _ in range(2)]
        await until(lambda: r.stream.buffered_bytes == 40)
        assert r.stream.open_connections == 4
        new = _connect(sock_path, _frame(2))
        await until(lambda: r.frames["ok"] == 2)
        assert r.stream.connections["evicted"] == 1 and r.stream.connections["refused"] == 0
        assert _closed_by_agent(silent)  # the oldest of those that never sent a frame
        engine.sendall(_frame(3))
        new.sendall(_frame(4))
        await until(lambda: r.frames["ok"] == 4)
        another = _connect(sock_path, _frame(5))  # a half-sent one makes way now
        await until(lambda: r.frames["ok"] == 5)
        out = collect(r)
        assert value(out, "kcops_probe_connections_total", outcome="evicted") == 2
        assert value(out, "kcops_probe_connections_open") == 4
        assert value(out, "kcops_probe_buffered_bytes") == 20
        for c in (engine, silent, *half, new, another):
            c.close()
        await r.stop()

    asyncio.run(main())


def test_silent_and_half_sent_connections_time_out_and_are_counted(sock_path: Path) -> None:
    """Nothing for ``connection_idle_timeout_s``: closed. A frame begun and unfinished
    ``partial_frame_timeout_s`` after it began: closed, even if a byte trickles in now and
    then, and counted as truncated. A connection that keeps sending stays."""
    now = [1000.0]
    r = ProbeReceiver(
        sock_path, clock=lambda: now[0], drain_interval_s=0.005,
        connection_idle_timeout_s=5.0, partial_frame_timeout_s=2.0,
    )  # fmt: skip

    async def main() -> None:
        await r.start()
        silent = _connect(sock_path)
        frame = _frame(1)
        trickle = _connect(sock_path, frame[:20])
        engine = _connect(sock_path, _frame(0))
        await until(lambda: r.frames["ok"] == 1 and r.stream.buffered_bytes == 20)
        now[0] += 1.5
        trickle.sendall(frame[20:21])  # a byte now and then does not keep a frame alive
        await until(lambda: r.stream.buffered_bytes == 21)
        now[0] += 1.0
        r.stream.sweep()
        assert r.stream.connections["partial_timeout"] == 1
        assert _closed_by_agent(trickle)
        assert r.refused == {"truncated": 1}
        engine.sendall(_frame(2))
        await until(lambda: r.frames["ok"] == 2)
        now[0] += 3.0  # silent: 5.5 s without a byte; the engine: 3 s
        r.stream.sweep()
        assert r.stream.connections["idle_timeout"] == 1
        assert _closed_by_agent(silent)
        assert r.stream.open_connections == 1
        engine.sendall(_frame(3))
        await until(lambda: r.frames["ok"] == 3)
        out = collect(r)
        assert value(out, "kcops_probe_connections_total", outcome="partial_timeout") == 1
        assert value(out, "kcops_probe_connections_total", outcome="idle_timeout") == 1
        for c in (silent, trickle, engine):
            c.close()
        await r.stop()

    asyncio.run(main())


def test_a_connection_with_bytes_waiting_is_not_timed_out(sock_path: Path) -> None:
    """A receiver that has not read yet (its budget paused it) is not a silent probe."""
    now = [1000.0]
    r = ProbeReceiver(
        sock_path, clock=lambda: now[0], drain_interval_s=30.0,
        connection_idle_timeout_s=5.0, partial_frame_timeout_s=2.0,
    )  # fmt: skip

    async def main() -> None:
        await r.start()
        c = _connect(sock_path)
        await until(lambda: r.stream.open_connections == 1)
        now[0] += 10.0
        c.sendall(_frame(0))  # came while the loop was not looking
        r.stream.sweep()
        assert r.stream.open_connections == 1
        r.stream._drain()
        assert r.frames["ok"] == 1
        c.close()
        await r.stop()

    asyncio.run(main())


class _NoDescriptors:
    """The listening socket, whose accept fails as it does with no descriptor left."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real
        self.accepts = 0
        self.failing = True

    def accept(self) -> tuple[socket.socket, Any]:
        self.accepts += 1
        if self.failing:
            raise OSError(errno.EMFILE, "Too many open files")
        return self.real.accept()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_failing_accept_backs_off_logs_once_and_is_counted(
    sock_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """EMFILE leaves the listening socket readable: accepting again at once was a busy loop
    (100% CPU, 100 MB of log in ten seconds). Now a few tries in 0.5 s, one log line,
    every try counted, and the connection waiting is taken once descriptors return."""
    r = ProbeReceiver(sock_path, drain_interval_s=0.005)
    caplog.set_level(logging.INFO, logger="kcops.agent.collectors.probe")

    async def main() -> None:
        await r.start()
        assert r.stream._sock is not None
        fake = r.stream._sock = _NoDescriptors(r.stream._sock)  # type: ignore[assignment]
        c = _connect(sock_path, _frame(0))
        await asyncio.sleep(0.5)
        assert 1 <= fake.accepts <= 5, fake.accepts  # at once, for ever: tens of thousands
        fails = fake.accepts
        lines = [x for x in caplog.records if "accept failed" in x.getMessage()]
        assert len(lines) == 1, [x.getMessage() for x in lines]
        out = collect(r)
        assert value(out, "kcops_collector_errors_total", collector="probe", reason="accept") == (
            fails
        )
        fake.failing = False
        await until(lambda: r.frames["ok"] == 1)
        c.close()
        r.stream._sock = fake.real
        await r.stop()

    asyncio.run(main())
