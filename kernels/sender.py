"""The probe's connection to the agent: a Unix stream socket that never blocks the engine.

Why a stream and not datagrams: a Unix datagram socket queues at most
``net.unix.max_dgram_qlen`` datagrams (10 on many hosts), so the agent had to wake
for about every tenth frame; a stream socket queues up to the sender's ``SO_SNDBUF``
bytes, so the agent can read every connection on a timer, thousands of frames per
read (docs/benchmarks.md). Frames keep their boundaries by the length in their header.

Never blocking: the socket is non-blocking from the start and ``send`` never waits.
A frame the kernel takes none of (the agent is slow, its queue full) is dropped and
counted by the caller. A frame the kernel takes part of is finished at the next
send before anything else goes (a stream must not interleave two frames); until then
new frames are dropped. No agent, or a refused connection: dropped, and the next
connection is tried after a back-off (1 s, doubling to 10 s) so that a probe the
agent turns away (too many connections) does not cost it an accept every flush. A
connection that broke after living a while (the agent restarted) is replaced at once.
``MSG_NOSIGNAL``: a closed peer is an error to count, never a SIGPIPE to the engine.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import time
from collections.abc import Callable

SNDBUF_BYTES = 1 << 20  # the queue a slow agent leaves a probe (the kernel may cap it)
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 10.0
YOUNG_S = 5.0  # a connection that breaks sooner was turned away, not restarted
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)


class Sent(enum.Enum):
    WHOLE = "whole"  # the kernel took the frame
    PART = "part"  # it took part of it; the rest goes before the next frame
    DROPPED = "dropped"  # nothing of it was sent


class StreamSender:
    """Frames to the agent's stream socket at ``path``; see the module docstring.

    ``abandoned`` counts frames that had gone out in part when their connection broke:
    the caller counted them as sent and now knows they were lost.
    """

    def __init__(
        self,
        path: str,
        *,
        sndbuf_bytes: int = SNDBUF_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.sndbuf_bytes = sndbuf_bytes
        self.abandoned = 0
        self._clock = clock
        self._sock: socket.socket | None = None
        self._rest = b""  # what the kernel has not taken of a frame sent in part
        self._retry_at = 0.0
        self._backoff = 0.0
        self._since = 0.0  # when the connection was made

    @property
    def connected(self) -> bool:
        return self._sock is not None

    def send(self, frame: bytes) -> Sent:
        """Queue one whole frame, or drop it; never waits."""
        if self._rest:
            self._finish()
            if self._rest:
                return Sent.DROPPED  # the earlier frame is still going out
        for _ in range(2):  # once more on a fresh connection if an old one had broken
            sock = self._connect()
            if sock is None:
                return Sent.DROPPED
            try:
                n = sock.send(frame, _NOSIGNAL)
            except (BlockingIOError, InterruptedError):
                return Sent.DROPPED
            except OSError:
                self._broken()
                continue
            if n < len(frame):
                self._rest = frame[n:]
                return Sent.PART
            return Sent.WHOLE
        return Sent.DROPPED

    def _finish(self) -> None:
        """Send what is left of a frame sent in part (if the connection broke meanwhile,
        the frame is abandoned)."""
        assert self._sock is not None
        try:
            n = self._sock.send(self._rest, _NOSIGNAL)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._broken()
            return
        self._rest = self._rest[n:]

    def _connect(self) -> socket.socket | None:
        if self._sock is not None:
            return self._sock
        now = self._clock()
        if now < self._retry_at:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf_bytes)
            sock.connect(self.path)  # a Unix socket connects at once, or fails (EAGAIN too)
        except OSError:
            sock.close()
            self._backoff = min(max(BACKOFF_FIRST_S, 2 * self._backoff), BACKOFF_MAX_S)
            self._retry_at = now + self._backoff
            return None
        self._sock, self._since = sock, now
        return sock

    def _broken(self) -> None:
        """The connection failed: close it; a young one means we were turned away."""
        now = self._clock()
        young = now - self._since < YOUNG_S
        self.close()
        if young:
            self._backoff = min(max(BACKOFF_FIRST_S, 2 * self._backoff), BACKOFF_MAX_S)
            self._retry_at = now + self._backoff
        else:
            self._backoff, self._retry_at = 0.0, 0.0

    def close(self) -> None:
        """Close the connection; a frame still going out in part is abandoned."""
        if self._rest:
            self.abandoned += 1
            self._rest = b""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
