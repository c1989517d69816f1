"""The probe's connection to the agent: never blocks, keeps frames whole, backs off when
turned away, and finds a restarted agent at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from kcops.kernels import sender as sender_mod
from kcops.kernels import wire
from kcops.kernels.sender import Sent, StreamSender


@pytest.fixture
def path() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="kcs-", dir="/tmp") as d:
        yield os.path.join(d, "p.sock")


def _listen(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(8)
    return s


def _read_all(conn: socket.socket) -> bytes:
    conn.setblocking(False)
    out = bytearray()
    try:
        while chunk := conn.recv(1 << 20):
            out += chunk
    except BlockingIOError:
        pass
    return bytes(out)


def _frames(data: bytes) -> list[bytes]:
    out = []
    while data:
        end = wire.HEADER.size + wire.HEADER.unpack_from(data)[2]
        assert end <= len(data), "a frame was cut"
        out.append(data[:end])
        data = data[end:]
    return out


def _frame(i: int, layers: int = 1) -> bytes:
    calls = {f"layer-{j}": i for j in range(layers)}
    return wire.encode(wire.Frame(pid=1, process="p", seq=i, calls_by_layer=calls))


def test_no_agent_drops_and_backs_off(path: str) -> None:
    now = [0.0]
    s = StreamSender(path, clock=lambda: now[0])
    assert s.send(_frame(0)) is Sent.DROPPED
    lst = _listen(path)  # the agent appears, but the probe waits out its back-off
    assert s.send(_frame(1)) is Sent.DROPPED and not s.connected
    now[0] = 1.0
    assert s.send(_frame(2)) is Sent.WHOLE and s.connected
    conn, _ = lst.accept()
    assert _frames(_read_all(conn)) == [_frame(2)]
    s.close()
    lst.close()


def test_a_full_queue_drops_never_blocks_and_frames_stay_whole(path: str) -> None:
    """A frame the kernel takes part of is finished before any other goes: the stream
    the agent reads holds whole frames only, in order."""
    lst = _listen(path)
    s = StreamSender(path, sndbuf_bytes=8192)
    big = [_frame(i, layers=2000) for i in range(6)]  # ~29 KB each, over the buffer
    outcomes = [s.send(f) for f in big[:3]]
    assert outcomes == [Sent.PART, Sent.DROPPED, Sent.DROPPED]  # never waited
    conn, _ = lst.accept()
    got = _read_all(conn)
    for f in big[3:]:
        while s.send(f) is Sent.DROPPED:  # each send takes what fits, never waits
            got += _read_all(conn)
        got += _read_all(conn)
    for _ in range(50):
        if not s._rest:
            break
        s.send(b"")  # nudges the rest of a frame out
        got += _read_all(conn)
    got += _read_all(conn)
    assert _frames(got) == [big[0], *big[3:]]
    s.close()
    lst.close()


def test_turned_away_the_probe_backs_off(path: str) -> None:
    """An agent at its connection limit accepts and closes: the probe's next send fails,
    and it does not try again every flush (1 s, then 2 s...)."""
    now = [100.0]
    lst = _listen(path)
    s = StreamSender(path, clock=lambda: now[0])
    assert s.send(_frame(0)) is Sent.WHOLE
    conn, _ = lst.accept()
    conn.close()
    lst.setblocking(False)
    assert s.send(_frame(1)) is Sent.DROPPED  # EPIPE on a young connection: back off
    now[0] += 0.5
    assert s.send(_frame(2)) is Sent.DROPPED
    with pytest.raises(BlockingIOError):
        lst.accept()  # no new attempt during the back-off
    now[0] += 0.6
    assert s.send(_frame(3)) is Sent.WHOLE
    s.close()
    lst.close()


def test_after_an_agent_restart_the_next_frame_goes_to_the_new_one(path: str) -> None:
    now = [100.0]
    old = _listen(path)
    s = StreamSender(path, clock=lambda: now[0])
    assert s.send(_frame(0)) is Sent.WHOLE
    conn, _ = old.accept()
    now[0] += sender_mod.YOUNG_S + 60  # a connection that lived a while
    conn.close()
    old.close()
    os.unlink(path)
    new = _listen(path)
    assert s.send(_frame(1)) is Sent.WHOLE  # the broken one replaced within the same send
    conn2, _ = new.accept()
    assert _frames(_read_all(conn2)) == [_frame(1)]
    s.close()
    new.close()


def test_a_closed_agent_never_signals_the_engine(path: str, tmp_path: Path) -> None:
    """With SIGPIPE at its default (an embedding host may restore it), a write to a closed
    peer would kill the engine; MSG_NOSIGNAL makes it an error to count."""
    code = f"""
import os, signal, socket, sys
sys.path.insert(0, {os.getcwd()!r})
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
from kcops.kernels.sender import StreamSender, Sent
lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); lst.bind({path!r}); lst.listen(1)
s = StreamSender({path!r})
assert s.send(b"x" * 10) is Sent.WHOLE
c, _ = lst.accept(); c.close()
now = [s.send(b"y" * 10) for _ in range(3)]
print("alive", [n.value for n in now])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("alive")
