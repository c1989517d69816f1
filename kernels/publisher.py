"""Sends the aggregate to the agent every flush interval over a Unix datagram socket.

Never blocks the engine: the socket is non-blocking, a frame that cannot be
sent (no agent, agent slow, buffer full) is dropped and counted. Sending runs
on a daemon thread; after ``fork()`` the child starts its own thread and
sequence (vLLM starts engine and worker processes that way).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable

from kcops.kernels import wire
from kcops.kernels.aggregate import Aggregator


def _process_name() -> str:
    """This process's name now: engines rename their processes after start (vLLM's worker
    becomes ``VLLM::Worker`` through setproctitle, which also sets ``comm``), so it is read
    at every flush, not once."""
    try:
        with open(f"/proc/{os.getpid()}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"


class Publisher:
    """Flushes ``aggregator`` to ``socket_path`` every ``interval_s``.

    ``before_flush`` runs on the publisher thread first (the probe resolves
    deferred GPU readings there). ``send`` is the datagram sender; tests pass
    their own. With ``wait_for_attention`` nothing is sent until the process has
    run an attention call: an engine's API server and scheduler load the probe
    too (vLLM's plugin runs in every process) but never run attention, and
    heartbeats from them would only add all-zero series.
    """

    def __init__(
        self,
        aggregator: Aggregator,
        socket_path: str,
        interval_s: float,
        *,
        before_flush: Callable[[], None] | None = None,
        enabled: bool = True,
        engine: str = wire.UNKNOWN_ENGINE,
    ) -> None:
        self.aggregator = aggregator
        self.socket_path = socket_path
        self.interval_s = interval_s
        self.before_flush = before_flush
        self.enabled = enabled
        self.engine = wire.check_engine(engine)  # sent with every frame: the `engine` label
        self.dropped_total = 0
        self.sent_total = 0
        self._seq = 0
        self._instance = uuid.uuid4().hex[:12]
        self._pid = os.getpid()
        self.wait_for_attention = False
        self._attention_seen = False
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._flush_lock = threading.Lock()

    def start(self) -> None:
        if not self.enabled or self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kcops-probe", daemon=True)
        self._thread.start()

    def stop(self, flush: bool = True) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(1.0, 2 * self.interval_s))
        if flush and self.enabled:
            self.flush()
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def after_fork_in_child(self) -> None:
        """A forked child has no publisher thread and must not reuse the parent's identity."""
        self._thread = None
        self._flush_lock = threading.Lock()
        self._sock = None
        self._seq = 0
        self._instance = uuid.uuid4().hex[:12]
        self._pid = os.getpid()
        self._attention_seen = False
        self.dropped_total = 0
        self.sent_total = 0
        self.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # the publisher must never take the engine down
                self.dropped_total += 1

    def flush(self) -> int:
        """Send what was aggregated since the last flush; returns frames sent."""
        with self._flush_lock:
            if self.before_flush is not None:
                self.before_flush()
            frame = self.aggregator.take(
                self._pid, _process_name(), self._seq, self._instance, time.time()
            )
            if frame.calls_by_layer:
                self._attention_seen = True
            elif self.wait_for_attention and not self._attention_seen:
                return 0
            frame.dropped_total = self.dropped_total
            frame.engine = self.engine
            sent = 0
            for part in wire.split(frame):
                part.dropped_total = self.dropped_total
                self._seq += 1
                if self._send(wire.encode(part)):
                    sent += 1
                else:
                    self.dropped_total += 1
            self.sent_total += sent
            return sent

    def _send(self, data: bytes) -> bool:
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(data, self.socket_path)
            return True
        except OSError:
            # ENOENT/ECONNREFUSED: no agent; EAGAIN/ENOBUFS: agent slow. Drop, never wait.
            return False
