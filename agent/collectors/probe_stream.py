"""The probe receiver's stream socket: probes connect and write frames.

Why a stream: a Unix datagram socket queues only ``net.unix.max_dgram_qlen`` datagrams
(often 10), so its reader must wake for about every tenth frame: at 10,000 frames a
second that was ~1,000 wake-ups and 10,000 ``recv`` calls a second, most of the
receiver's CPU (docs/benchmarks.md). A stream connection queues up to its sender's
``SO_SNDBUF`` bytes, so this server does not read on every arrival: when a connection
becomes readable it stops watching it and reads every connection together
``interval_s`` later, each in a few large ``recv_into`` calls, then watches them again.
An idle agent thus costs nothing, and a busy one about ``1 / interval_s`` wake-ups a second.

Frames keep their boundaries by their headers (``wire``); the consumer gets each
read's bytes (with the unfinished frame of the last read in front) and says how far
it took them. A stream whose bytes are not a frame header where one must start is
out of step for good and is closed (the probe reconnects). At most
``max_connections`` are kept; more are closed at once and counted (a probe backs off).
Never on a thread: everything runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

from kcops.kernels import wire

log = logging.getLogger("kcops.agent.collectors.probe")

READ_BYTES = 1 << 18  # one recv_into
READ_MAX_BYTES = 4 << 20  # per connection per drain: a flood cannot hold the loop long
SOCKET_MODE = 0o660  # srw-rw----
BACKLOG = 128


def clear_stale_socket(path: Path) -> None:
    """Remove a socket left at ``path`` by an earlier agent (the last agent wins); refuse
    (OSError) to remove anything that is not a socket."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
        else:
            raise OSError(17, f"{path} exists and is not a socket")


class _Conn:
    __slots__ = ("rest", "sock", "watched")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.rest = b""  # the start of a frame the last read ended inside
        self.watched = False


class StreamServer:
    """Accepts probe connections at ``path`` and hands their bytes to ``consume`` (which
    returns how many it took, or -1 for bytes that are no frame: that stream is closed).

    ``paused_s`` says, before each drain, how long to wait instead of reading (the
    receiver's budget for the current second is spent), or None to read now.
    """

    def __init__(
        self,
        path: Path,
        consume: Callable[[bytes], int],
        *,
        max_connections: int,
        interval_s: float,
        paused_s: Callable[[], float | None],
        on_truncated: Callable[[], None],
    ) -> None:
        self.path = path
        self.consume = consume
        self.max_connections = max_connections
        self.interval_s = interval_s
        self.paused_s = paused_s
        self.on_truncated = on_truncated
        self.connections: dict[str, int] = {"accepted": 0, "refused": 0, "out_of_step": 0}
        self.drains = 0  # timer wake-ups that read (benchmarks count them)
        self._conns: dict[int, _Conn] = {}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._inode: int | None = None
        self._buf = bytearray(READ_BYTES + wire.MAX_FRAME_BYTES)
        self._view = memoryview(self._buf)

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind and listen (raises OSError)."""
        path = self.path
        clear_stale_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(path))
            # The engine may run as another user in the agent's group (the pod's two UIDs):
            # group read-write, whatever the umask. Others: nothing.
            os.chmod(path, SOCKET_MODE)
            sock.listen(BACKLOG)
            sock.setblocking(False)
            self._inode = path.stat().st_ino
        except OSError:
            sock.close()
            raise
        loop.add_reader(sock.fileno(), self._accept)
        self._sock, self._loop = sock, loop

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fd in list(self._conns):
            self._close(fd)
        if self._sock is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            with contextlib.suppress(OSError):  # only if still ours
                if self.path.stat().st_ino == self._inode:
                    os.unlink(self.path)

    def _accept(self) -> None:
        assert self._sock is not None
        for _ in range(BACKLOG):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("probe stream socket: accept failed: %s", exc)
                return
            if len(self._conns) >= self.max_connections:
                conn.close()
                self.connections["refused"] += 1
                n = self.connections["refused"]
                if n & (n - 1) == 0:
                    log.warning(
                        "probe: connection #%d refused: %d connections open (max_connections)",
                        n, len(self._conns),
                    )  # fmt: skip
                continue
            conn.setblocking(False)
            self.connections["accepted"] += 1
            c = self._conns[conn.fileno()] = _Conn(conn)
            self._watch(c)

    def _watch(self, c: _Conn) -> None:
        assert self._loop is not None
        fd = c.sock.fileno()
        self._loop.add_reader(fd, self._readable, fd)
        c.watched = True

    def _readable(self, fd: int) -> None:
        """Data waits on ``fd``: stop watching it; read everything one interval later."""
        c = self._conns.get(fd)
        if c is not None and c.watched:
            assert self._loop is not None
            self._loop.remove_reader(fd)
            c.watched = False
        if self._timer is None:
            assert self._loop is not None
            self._timer = self._loop.call_later(self.interval_s, self._drain)

    def _drain(self) -> None:
        self._timer = None
        self.drains += 1
        for fd, c in list(self._conns.items()):
            if not self._read(fd, c):
                continue
            if self._timer is not None:  # the budget ran out: read on when it is back
                return
            if not c.watched:
                self._watch(c)

    def _pause(self) -> bool:
        """True (and a drain set for later) when this second's budget is spent: the
        bytes stay queued in the kernel, the probes' queues fill, and they drop."""
        wait = self.paused_s()
        if wait is None:
            return False
        assert self._loop is not None
        if self._timer is None:
            self._timer = self._loop.call_later(max(wait, 0.001), self._drain)
        return True

    def _read(self, fd: int, c: _Conn) -> bool:
        """Read what ``c`` has queued (up to a bound, and while the budget lasts); False
        if it was closed."""
        buf, view = self._buf, self._view
        got = 0
        while got < READ_MAX_BYTES:
            if self._pause():
                return True
            r = len(c.rest)
            buf[:r] = c.rest
            try:
                n = c.sock.recv_into(view[r:], READ_BYTES)
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as exc:
                log.info("probe stream connection lost: %s", exc)
                n = 0
            if n == 0:  # the probe closed it (or it broke): an unfinished frame is lost
                if c.rest:
                    self.on_truncated()
                self._close(fd)
                return False
            got += n
            data = bytes(view[: r + n])
            try:
                took = self.consume(data)
            except Exception as exc:  # a receiver bug must not stop every read after it
                log.error("probe stream: frames refused by a receiver bug: %r", exc)
                took = -1
            if took < 0:
                self.connections["out_of_step"] += 1
                self._close(fd)
                return False
            c.rest = data[took:]
            if n < READ_BYTES:
                return True
        return True

    def _close(self, fd: int) -> None:
        c = self._conns.pop(fd, None)
        if c is None:
            return
        if c.watched and self._loop is not None:
            self._loop.remove_reader(fd)
        c.sock.close()
