"""Sends the aggregate to the agent every flush interval over a Unix stream socket.

Never blocks the engine: the connection is non-blocking (:mod:`kcops.kernels.sender`),
a frame that cannot be sent (no agent, agent slow, queue full) is dropped and counted,
and the next frame that goes says how many were dropped since the last one did.
Sending runs on a daemon thread; after ``fork()`` the child starts its own thread,
sequence and connection (vLLM starts engine and worker processes that way).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

from kcops.kernels import wire
from kcops.kernels.aggregate import Aggregator
from kcops.kernels.sender import Sent, StreamSender


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
    """Flushes ``aggregator`` to the agent at ``socket_path`` every ``interval_s``.

    ``socket_path`` names the agent's stream socket (:func:`wire.default_socket_path`).
    ``before_flush``
    runs on the publisher thread first (the probe resolves deferred GPU readings there).
    K(C) by layer goes with every ``kc_every``-th frame. With ``wait_for_attention``
    nothing is sent until the process has run an attention call: an engine's API server
    and scheduler load the probe too (vLLM's plugin runs in every process) but never run
    attention, and heartbeats from them would only add all-zero series.
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
        kc_every: int = 1,
        p: float = 0.9,
    ) -> None:
        self.aggregator = aggregator
        self.socket_path = socket_path
        self.interval_s = interval_s
        self.before_flush = before_flush
        self.enabled = enabled
        self.engine = wire.check_engine(engine)  # sent with every frame: the `engine` label
        self.model = ""  # the served model, when an integration knows it (wire.Frame.model)
        self.p = p  # the mass the K(C) values are K_p of (wire.Frame.p)
        self.kc_every = max(1, kc_every)
        self.wait_for_attention = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._new_identity()

    def _new_identity(self) -> None:
        """Sequence, instance, counters and connection of a new probe (start, fork)."""
        self.dropped_total = 0  # frames this probe could not send, all along
        self.sent_total = 0
        self._unreported = 0  # frames dropped that no frame sent has reported yet
        self._in_flight = 0  # the drops reported by a frame the kernel took part of
        self._seq = 0
        self._flushes = 0
        self._instance = os.urandom(6).hex()
        self._pid = os.getpid()
        self._attention_seen = False
        self._sender: StreamSender | None = None
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
            self.flush(kc=True)
        if self._sender is not None:
            self._sender.close()
            self._account_abandoned()

    def after_fork_in_child(self) -> None:
        """A forked child has no publisher thread and must not reuse the parent's identity,
        nor ever write to the parent's connection (two writers would interleave frames)."""
        parent = self._sender
        self._thread = None
        self._new_identity()
        if parent is not None and parent._sock is not None:
            parent._sock.close()  # this process's copy of the descriptor only
        self.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.flush()
            except Exception:  # the publisher must never take the engine down
                self.dropped_total += 1
                self._unreported += 1

    def flush(self, kc: bool | None = None) -> int:
        """Send what was aggregated since the last flush; returns frames sent. K(C) by
        layer goes along with ``kc``, or (None) on every ``kc_every``-th flush."""
        with self._flush_lock:
            if self.before_flush is not None:
                self.before_flush()
            self._flushes += 1
            with_kc = self._flushes % self.kc_every == 0 if kc is None else kc
            d = self.aggregator.take(kc=with_kc)
            if d.calls_by_layer:
                self._attention_seen = True
            elif self.wait_for_attention and not self._attention_seen:
                return 0
            sender = self._connection()
            self._account_abandoned()
            # The one place a frame is made: the numbers, and who sends them. The first
            # tenant's request histograms go with it, each other's in a frame of its own.
            tenants = list(d.requests.items()) or [("", {})]
            sent = 0
            for i, (tenant, requests) in enumerate(tenants):
                first = i == 0
                frame = wire.Frame(
                    pid=self._pid,
                    process=_process_name(),
                    seq=self._seq,
                    instance=self._instance,
                    ts=time.time(),
                    calls_by_layer=d.calls_by_layer if first else {},
                    errors=d.errors if first else {},
                    histograms={**d.histograms, **requests} if first else requests,
                    topn_mass=d.topn_mass if first else {},
                    engine=self.engine,
                    kc_by_layer=d.kc_by_layer if first else {},
                    internal_errors=d.internal_errors if first else 0,
                    dropped=min(self._unreported, wire.MAX_U32) if first else 0,
                    model=self.model,
                    tenant=tenant,
                    p=self.p,
                )
                sent += self._send_frame(sender, frame)
            return sent

    def _send_frame(self, sender: StreamSender, frame: wire.Frame) -> int:
        sent = 0
        for part in wire.split(frame):
            self._seq += 1
            outcome = sender.send(wire.encode(part))
            if outcome is Sent.DROPPED:
                self.dropped_total += 1
                self._unreported += 1
                continue
            sent += 1
            self._unreported -= part.dropped  # reported (the other parts say 0)
            self._in_flight = part.dropped if outcome is Sent.PART else 0
        self.sent_total += sent
        return sent

    def _connection(self) -> StreamSender:
        path = self.socket_path
        if self._sender is None or self._sender.path != path:
            if self._sender is not None:
                self._sender.close()
                self._account_abandoned()
            self._sender = StreamSender(path)
        return self._sender

    def _account_abandoned(self) -> None:
        """Frames counted as sent that went out in part before their connection broke."""
        sender = self._sender
        if sender is not None and sender.abandoned:
            lost, sender.abandoned = sender.abandoned, 0
            self.dropped_total += lost
            self.sent_total -= lost
            self._unreported += lost + self._in_flight  # and the drops they reported
            self._in_flight = 0
