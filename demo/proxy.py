"""A TCP proxy that adds network latency: the cause of the segment-transfer drill.

The demo puts it between the reference worker and its Redis tier. With
``delay_s`` at 0 it only forwards; set higher, each request burst from the
client (a Redis command, or a large value sent in many segments back to back)
waits ``delay_s`` before it is forwarded, as on a slow or distant link. The
worker measures its segment reloads around the Redis round trip, so the delay
shows in ``kcops_segment_transfer_seconds`` the way a slow network would.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

BURST_GAP_S = 0.002  # bytes closer together than this belong to the same burst


class DelayProxy:
    """Forward ``127.0.0.1:port`` to ``target``; ``delay_s`` may change at any time."""

    def __init__(self, target_host: str, target_port: int, *, delay_s: float = 0.0) -> None:
        if delay_s < 0:
            raise ValueError(f"delay_s must be >= 0, got {delay_s}")
        self.target = (target_host, target_port)
        self.delay_s = delay_s
        self.bursts_delayed = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> DelayProxy:
        threading.Thread(target=self._accept, name="delay-proxy", daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with contextlib.suppress(OSError):
                c.close()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns += [client, upstream]
            for src, dst, delayed in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pipe, args=(src, dst, delayed), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delayed: bool) -> None:
        last = float("-inf")
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if delayed and self.delay_s > 0 and time.monotonic() - last > BURST_GAP_S:
                    self.bursts_delayed += 1
                    time.sleep(self.delay_s)
                dst.sendall(data)
                last = time.monotonic()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
