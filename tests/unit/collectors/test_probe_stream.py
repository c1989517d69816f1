"""The receiver over a real socket: probes connect to its stream socket; connections are
bounded, a stream out of step is closed, and once a second's time budget is spent the
receiver stops reading until the next second."""

from __future__ import annotations

import asyncio
import socket
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kcops.agent.collectors.probe import ProbeReceiver, ReceiveBudget
from kcops.errors import CollectorUnavailable
from kcops.kernels import wire
from kcops.kernels.aggregate import Aggregator
from kcops.kernels.publisher import Publisher
from tests.unit.collectors.helpers import collect, value

PY = {"engine": "unknown", "process": "p"}


@pytest.fixture
def sock_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kcr-", dir="/tmp") as d:  # AF_UNIX: short paths
        yield Path(d) / "probe.sock"


async def until(cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Let the loop run until ``cond()`` holds (the receiver works on the loop)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        assert loop.time() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


def _frame(seq: int, **kw: object) -> bytes:
    return wire.encode(wire.Frame(pid=1, process="p", seq=seq, **kw))  # type: ignore[arg-type]


def test_a_publisher_reaches_the_receiver_over_the_stream_socket(sock_path: Path) -> None:
    r = ProbeReceiver(sock_path, drain_interval_s=0.01)

    async def main() -> None:
        await r.start()
        assert sock_path.is_socket()
        agg = Aggregator((16,))
        pub = Publisher(agg, str(sock_path), 60.0, kc_every=2)
        for _ in range(6):
            agg.call("0", 100)
            agg.call("1", 100)
            agg.observe_kc("1", 40, 0.4, {16: 0.9})
            agg.internal_error()
            assert await asyncio.to_thread(pub.flush) == 1
        await until(lambda: r.frames["ok"] == 6)
        out = collect(r)
        labels = {"engine": "unknown", "process": _comm()}
        assert value(out, "kcops_attention_calls_total", layer="1", **labels) == 6
        # K(C) by layer goes with every second frame (kc_every=2): all 6 rows arrived
        assert value(out, "kcops_kc_tokens_count", layer="1", **labels) == 6
        assert value(out, "kcops_kc_tokens_count", layer="0", **labels) is None
        assert value(out, "kcops_probe_internal_errors_total", **labels) == 6
        assert value(out, "kcops_probe_connections_open") == 1
        assert value(out, "kcops_probe_connections_total", outcome="accepted") == 1
        assert r.bulked >= 4  # after each shape's first frame, the bulk path
        pub.stop(flush=False)
        await until(lambda: r.stream.open_connections == 0)
        await r.stop()

    asyncio.run(main())
    assert not sock_path.exists()


def _comm() -> str:
    with open("/proc/self/comm") as fh:
        return fh.read().strip()


def test_past_the_limit_only_a_connection_with_bytes_waiting_on_each_is_refused(
    sock_path: Path,
) -> None:
    """A new connection takes the place of one with nothing to read (tests/unit/collectors/
    test_probe_held.py); when every connection has bytes waiting (read only every 30 s
    here), none is closed for it: it is refused and counted, and no queued frame is lost."""
    r = ProbeReceiver(sock_path, max_connections=2, drain_interval_s=30.0)

    async def main() -> None:
        await r.start()
        clients = []
        for i in range(2):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(r.socket_path))
            c.sendall(_frame(i, calls_by_layer={"0": 1}))
            clients.append(c)
        conns = r.stream._conns
        await until(lambda: len(conns) == 2 and not any(c.watched for c in conns.values()))
        for _ in range(2):
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(r.socket_path))
            clients.append(c)
        await until(lambda: r.stream.connections["refused"] == 2)
        assert r.stream.connections["evicted"] == 0 and r.stream.open_connections == 2
        r.stream._drain()  # what the timer would do 30 s later
        assert r.frames["ok"] == 2
        for c in clients:
            c.close()
        await r.stop()

    asyncio.run(main())


def test_a_stream_out_of_step_is_closed_and_the_rest_still_counts(sock_path: Path) -> None:
    r = ProbeReceiver(sock_path, drain_interval_s=0.01)

    async def main() -> None:
        await r.start()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bad:
            bad.connect(str(r.socket_path))
            bad.sendall(_frame(0, calls_by_layer={"0": 1}) + b"not a header at all")
            await until(lambda: r.stream.connections["out_of_step"] == 1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as cut:
            cut.connect(str(r.socket_path))
            whole = _frame(1, calls_by_layer={"0": 1})
            cut.sendall(whole + whole[:20])  # then the probe dies mid-frame
        await until(lambda: r.frames["ok"] == 2 and r.frames["malformed"] == 2)
        await until(lambda: r.stream.open_connections == 0)
        assert r.refused == {"bad_magic": 1, "truncated": 1}
        out = collect(r)
        assert value(out, "kcops_attention_calls_total", layer="0", **PY) == 2
        await r.stop()

    asyncio.run(main())


def test_budget_counts_frames_and_time_per_second() -> None:
    now = [100.25]
    b = ReceiveBudget(3, 0.050, lambda: now[0])
    assert [b.admit() for _ in range(4)] == [True, True, True, False]
    assert b.allowance() == 0 and b.paused_s() is None
    b.busy_s += 0.06
    assert b.paused_s() == pytest.approx(0.75) and b.pauses == 1
    assert b.paused_s() is not None and b.pauses == 1  # one pause per second, counted once
    now[0] = 101.0
    assert b.paused_s() is None and b.allowance() == 3


def test_expensive_reads_are_bounded_by_time_not_just_count(sock_path: Path) -> None:
    """A 4,096-layer frame costs far more to decode than a small one: frames per second
    alone bound nothing. Here each read 'costs' 10 ms of a fake timer; with 45 ms a second
    allowed, the receiver stops reading after five and reads the rest the next second."""
    now = [100.5]
    ticks = [0.0]

    def timer() -> float:
        ticks[0] += 0.01  # read before and after each read's frames: 10 ms a read
        return ticks[0]

    r = ProbeReceiver(
        sock_path, max_receive_ms_per_s=45, clock=lambda: now[0], timer=timer,
        drain_interval_s=0.005,
    )  # fmt: skip

    async def main() -> None:
        await r.start()
        clients = []
        for i in range(8):  # one frame on each of 8 connections: 8 reads
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(sock_path))
            c.sendall(_frame(i, calls_by_layer={"0": 1}))
            clients.append(c)
        await until(lambda: r.budget.pauses == 1)
        await asyncio.sleep(0.05)  # the loop stays free: nothing more is read this second
        assert r.frames["ok"] == 5
        now[0] = 101.0
        await until(lambda: r.frames["ok"] == 8)
        out = collect(r)
        assert value(out, "kcops_probe_receive_paused_total") == 1
        for c in clients:
            c.close()
        await r.stop()

    asyncio.run(main())


def test_the_stream_pauses_on_the_budget_too(sock_path: Path) -> None:
    now = [100.5]
    ticks = [0.0]

    def timer() -> float:
        ticks[0] += 0.06  # every read costs 60 ms
        return ticks[0]

    r = ProbeReceiver(
        sock_path, max_receive_ms_per_s=50, clock=lambda: now[0], timer=timer,
        drain_interval_s=0.005,
    )  # fmt: skip

    async def main() -> None:
        await r.start()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(r.socket_path))
            c.sendall(_frame(0, calls_by_layer={"0": 1}))
            await until(lambda: r.frames["ok"] == 1)
            c.sendall(_frame(1, calls_by_layer={"0": 1}))
            await until(lambda: r.budget.pauses == 1)
            await asyncio.sleep(0.05)
            assert r.frames["ok"] == 1  # queued in the kernel, not read
            now[0] = 101.0
            await until(lambda: r.frames["ok"] == 2)
        await r.stop()

    asyncio.run(main())


def test_a_path_past_the_unix_limit_is_reported_by_name() -> None:
    with tempfile.TemporaryDirectory(prefix="kcl-", dir="/tmp") as d:
        path = Path(d) / ("p" * (110 - len(d)))  # past the 108 bytes of sun_path
        r = ProbeReceiver(path)

        async def main() -> None:
            await r.start()
            await r.stop()

        asyncio.run(main())
        assert r._start_error is not None and str(path) in r._start_error
        with pytest.raises(CollectorUnavailable, match="cannot listen"):
            r.collect(0.0)


def test_the_socket_is_group_read_write_whatever_the_umask(sock_path: Path) -> None:
    # In the pod the engine runs as another UID in the agent's group (docs/deploy.md).
    import os
    import stat

    r = ProbeReceiver(sock_path)
    old = os.umask(0o022)  # the usual umask: it would leave the socket 0755

    async def main() -> None:
        try:
            await r.start()
        finally:
            os.umask(old)
        try:
            mode = stat.S_IMODE(sock_path.stat().st_mode)
            assert mode == 0o660, oct(mode)
        finally:
            await r.stop()

    asyncio.run(main())
