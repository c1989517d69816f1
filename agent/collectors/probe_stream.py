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
out of step for good and is closed (the probe reconnects).

Held connections cannot starve the engine's own (issue 24): a connection that sent
nothing for ``idle_timeout_s`` is closed (the probe reconnects at its next frame and
sends it there, so nothing is lost), and one that began a frame and has not finished
it within ``partial_timeout_s`` is closed and the frame counted as truncated. At most
``max_connections`` are kept: when a new one comes with the limit reached, the
connection least likely to be an engine's is closed for it (``evicted``): one that
never delivered a whole frame before one that did, the oldest first; only connections
with nothing waiting to be read are candidates, so no queued frame is lost. With no
candidate the new one is closed at once (``refused``; a probe backs off). Each
connection holds at most one unfinished frame (``wire.MAX_FRAME_BYTES``): a header
that says more is out of step.

An accept that fails (EMFILE, ENFILE: no descriptor left) is retried after a back-off,
never at once, and logged at most once a minute with its count; every failed accept
or read is counted (``errors``, exported as ``kcops_collector_errors_total``).
Each connection is handed on with its peer: the pid of the process at the other end
(``SO_PEERCRED``), or, where the kernel cannot say (0: a process of another pid
namespace), minus its descriptor: one connection. Never on a thread: everything runs on
the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path

from kcops.agent.backoff import Backoff, RepeatLog
from kcops.kernels import wire

log = logging.getLogger("kcops.agent.collectors.probe")

READ_BYTES = 1 << 18  # one recv_into
READ_MAX_BYTES = 4 << 20  # per connection per drain: a flood cannot hold the loop long
SOCKET_MODE = 0o660  # srw-rw----
BACKLOG = 128
# Outcomes of kcops_probe_connections_total: accepted, and why each was closed by the agent.
OUTCOMES = ("accepted", "refused", "evicted", "idle_timeout", "partial_timeout", "out_of_step")
ACCEPT_RETRY_FIRST_S = 0.1  # a failed accept (EMFILE...) is tried again after this,
ACCEPT_RETRY_MAX_S = 2.0  # doubling up to this, until one succeeds
SWEEP_MAX_S = 1.0  # timeouts are checked at least this often while connections are open


def clear_stale_socket(path: Path) -> None:
    """Remove a socket left at ``path`` by an earlier agent (the last agent wins); refuse
    (OSError) to remove anything that is not a socket."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()
        else:
            raise OSError(17, f"{path} exists and is not a socket")


def peer_of(sock: socket.socket) -> int:
    """The pid of the process that connected ``sock`` (``SO_PEERCRED``), else minus its
    descriptor."""
    pid: int = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    return pid or -sock.fileno()


def _quiet(c: _Conn) -> bool:
    """Nothing waits to be read on ``c`` (bytes that came since the loop last looked are
    read, not thrown away with the connection); a closed peer is quiet."""
    try:
        return not c.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:  # EAGAIN: nothing; anything else: it is broken, and closing loses nothing
        return True


class _Conn:
    __slots__ = ("active_at", "frame_at", "partial_at", "peer", "rest", "sock", "watched")

    def __init__(self, sock: socket.socket, now: float) -> None:
        self.sock = sock
        self.peer = peer_of(sock)
        self.rest = b""  # the start of a frame the last read ended inside
        self.watched = False  # True: nothing waits to be read (that the loop knows of)
        self.active_at = now  # when its last bytes came (or it was accepted)
        self.partial_at: float | None = None  # when its unfinished frame began
        self.frame_at: float | None = None  # when its last whole frame was taken

    def eviction_order(self) -> tuple[bool, float]:
        """Smallest first: never a whole frame before some, then the longest ago."""
        return (self.frame_at is not None, self.frame_at or self.active_at)


class StreamServer:
    """Accepts probe connections at ``path`` and hands their bytes and peer to ``consume``
    (which returns how many it took, or -1 for bytes that are no frame: that stream is
    closed).

    ``paused_s`` says, before each drain, how long to wait instead of reading (the
    receiver's budget for the current second is spent), or None to read now.
    """

    def __init__(
        self,
        path: Path,
        consume: Callable[[bytes, int], int],
        *,
        max_connections: int,
        interval_s: float,
        paused_s: Callable[[], float | None],
        on_truncated: Callable[[], None],
        idle_timeout_s: float = 60.0,
        partial_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.consume = consume
        self.max_connections = max_connections
        self.interval_s = interval_s
        self.paused_s = paused_s
        self.on_truncated = on_truncated
        self.idle_timeout_s = idle_timeout_s
        self.partial_timeout_s = partial_timeout_s
        self.clock = clock
        self.connections: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.repeats = RepeatLog(log)  # its counts: failed accepts and reads, by kind
        self._accept_backoff = Backoff(ACCEPT_RETRY_FIRST_S, ACCEPT_RETRY_MAX_S)
        self._accept_retry: asyncio.TimerHandle | None = None
        self._sweep: asyncio.TimerHandle | None = None
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

    @property
    def buffered_bytes(self) -> int:
        """Bytes of unfinished frames held (at most ``wire.MAX_FRAME_BYTES`` a connection)."""
        return sum(len(c.rest) for c in self._conns.values())

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
        for handle in (self._timer, self._accept_retry, self._sweep):
            if handle is not None:
                handle.cancel()
        self._timer = self._accept_retry = self._sweep = None
        for fd in list(self._conns):
            self._close(fd)
        if self._sock is not None:
            assert self._loop is not None
            if self._accept_retry is None:  # else it is not watched now
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            with contextlib.suppress(OSError):  # only if still ours
                if self.path.stat().st_ino == self._inode:
                    os.unlink(self.path)

    def _accept(self) -> None:
        assert self._sock is not None and self._loop is not None
        for _ in range(BACKLOG):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._accept_failed(exc)
                return
            self._accept_backoff.reset()
            now = self.clock()
            if len(self._conns) >= self.max_connections and not self._evict_one():
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
            c = self._conns[conn.fileno()] = _Conn(conn, now)
            self._watch(c)
            if self._sweep is None:
                self._sweep = self._loop.call_later(self._sweep_s(), self._swept)

    def _accept_failed(self, exc: OSError) -> None:
        """An accept failed (EMFILE, ENFILE, ENOBUFS...): the socket stays readable, so stop
        watching it and try again after a back-off; never at once, which was a busy loop."""
        assert self._sock is not None and self._loop is not None
        delay = self._accept_backoff.next()
        self.repeats(
            "accept", logging.WARNING,
            "probe stream socket: accept failed, retrying in %.1f s (at most %.0f s): %s",
            delay, ACCEPT_RETRY_MAX_S, exc,
        )  # fmt: skip
        self._loop.remove_reader(self._sock.fileno())
        self._accept_retry = self._loop.call_later(delay, self._accept_again)

    def _accept_again(self) -> None:
        self._accept_retry = None
        if self._sock is not None and self._loop is not None:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def _evict_one(self) -> bool:
        """Close the connection least likely to be an engine's, of those with nothing
        waiting to be read, for a new one; False if there is none."""
        idle = sorted((c.eviction_order(), fd) for fd, c in self._conns.items() if c.watched)
        fd = next((fd for _, fd in idle if _quiet(self._conns[fd])), None)
        if fd is None:
            return False
        self._close(fd, "evicted")
        n = self.connections["evicted"]
        if n & (n - 1) == 0:
            log.warning(
                "probe: connection #%d evicted for a new one: %d connections open "
                "(max_connections)", n, len(self._conns) + 1,
            )  # fmt: skip
        return True

    def _sweep_s(self) -> float:
        return min(SWEEP_MAX_S, self.partial_timeout_s / 2, self.idle_timeout_s / 2)

    def _swept(self) -> None:
        assert self._loop is not None
        self._sweep = None
        self.sweep()
        if self._conns:
            self._sweep = self._loop.call_later(self._sweep_s(), self._swept)

    def sweep(self) -> None:
        """Close connections that sent nothing for ``idle_timeout_s``, or began a frame
        more than ``partial_timeout_s`` ago and have not finished it. Only connections
        with nothing waiting to be read: a paused receiver is not a silent probe."""
        now = self.clock()
        for fd, c in list(self._conns.items()):
            if not c.watched:
                continue
            if c.partial_at is not None:
                if now - c.partial_at > self.partial_timeout_s and _quiet(c):
                    self.on_truncated()
                    self._close(fd, "partial_timeout")
            elif now - c.active_at > self.idle_timeout_s and _quiet(c):
                self._close(fd, "idle_timeout")

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
            except OSError as exc:  # ECONNRESET...: this connection ends here
                self.repeats("read", logging.INFO, "probe stream connection lost: %s", exc)
                n = 0
            if n == 0:  # the probe closed it (or it broke): an unfinished frame is lost
                if c.rest:
                    self.on_truncated()
                self._close(fd)
                return False
            got += n
            data = bytes(view[: r + n])
            try:
                took = self.consume(data, c.peer)
            except Exception as exc:  # a receiver bug must not stop every read after it
                log.error("probe stream: frames refused by a receiver bug: %r", exc)
                took = -1
            if took < 0:
                self._close(fd, "out_of_step")
                return False
            now = c.active_at = self.clock()
            if took:
                c.frame_at = now
            c.rest = data[took:]
            if not c.rest:
                c.partial_at = None
            elif took or c.partial_at is None:
                c.partial_at = now  # a new frame began in this read
            if n < READ_BYTES:
                return True
        return True

    def _close(self, fd: int, outcome: str | None = None) -> None:
        """Close ``fd``'s connection; ``outcome``: why the agent closed it (counted)."""
        c = self._conns.pop(fd, None)
        if c is None:
            return
        if outcome is not None:
            self.connections[outcome] += 1
        if c.watched and self._loop is not None:
            self._loop.remove_reader(fd)
        c.sock.close()
