"""Probe receiver: the engine's attention probe sends frames to the agent.

Two sockets, one directory (``kcops.kernels.wire.default_socket_path()`` unless
configured): ``probe.sock.stream`` (:mod:`probe_stream`), where version 4 probes
connect and write frames, read in bulk every ``drain_interval_s``; and
``probe.sock``, the datagram socket of probes before version 4, kept for one release.

Frames (``kcops.kernels.wire``) carry per-process DELTAS since the probe's
previous frame; :mod:`probe_state` sums them into cumulative counters and
histograms per (engine, process), within cardinality bounds, and
:meth:`ProbeReceiver.collect` returns them. Series carry ``engine`` (what the probe
says it runs in: ``vllm`` from the vLLM plugin, ``kcops`` from the reference worker,
``unknown`` from a bare probe or a frame older than version 3) and ``process`` (the
process name the probe reports, not its pid, so a restarted engine continues the
same series); K(C) (``kcops_kc_tokens``) also ``layer`` (``unknown`` before version 4).

A frame that is not valid is counted in
``kcops_probe_frames_total{outcome="malformed"|"unknown_version"}`` and dropped;
the receiver never raises on input. Receiving is bounded in cost as well as in
count, so a runaway or hostile publisher cannot starve the agent's loop: past
``max_frames_per_s`` frames in one second the rest are shed undecoded
(``outcome="shed"``), and once the receiver has spent ``max_receive_ms_per_s`` of
that second it stops reading until the next one (``kcops_probe_receive_paused_total``;
the probes' queues fill, and they drop and count frames without ever waiting). A
4,096-layer JSON frame costs ~2 ms to refuse, so a count alone bounded nothing.
Everything runs on the event loop (no threads). Version 4 frames of a shape seen
before are summed in bulk (:mod:`probe_bulk`), versions 3 and 2 by
:mod:`probe_sums`; anything else, and the first frame of each shape, by
``wire.decode``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

from kcops.agent.collectors import probe_bulk, probe_sums
from kcops.agent.collectors.probe_bulk import Shape
from kcops.agent.collectors.probe_state import ProbeSums
from kcops.agent.collectors.probe_stream import SOCKET_MODE, StreamServer, clear_stale_socket
from kcops.agent.collectors.probe_sums import PendingSums, ShapeCache
from kcops.agent.samples import Sample
from kcops.errors import CollectorUnavailable
from kcops.kernels import wire

log = logging.getLogger("kcops.agent.collectors.probe")

RCVBUF_BYTES = 4 << 20
# Datagrams read per reader callback: enough to empty a busy socket in a few
# callbacks, few enough that a flood cannot hold the loop for long.
DRAIN_MAX = 256
MAX_PENDING = 64  # version-3 shapes summed per process before they are folded in early


class Budget:
    """Receiving work allowed in each second of ``clock``: frames and loop time."""

    def __init__(self, max_frames: int, max_busy_s: float, clock: Callable[[], float]) -> None:
        self.max_frames = max_frames
        self.max_busy_s = max_busy_s
        self.clock = clock
        self.window = -1
        self.frames = 0
        self.busy_s = 0.0
        self.pauses = 0
        self._paused = False

    def roll(self) -> None:
        w = int(self.clock())
        if w != self.window:
            self.window, self.frames, self.busy_s, self._paused = w, 0, 0.0, False

    def allowance(self) -> int:
        """Frames still allowed this second."""
        self.roll()
        return max(0, self.max_frames - self.frames)

    def admit(self) -> bool:
        self.roll()
        self.frames += 1
        return self.frames <= self.max_frames

    def paused_s(self) -> float | None:
        """Seconds until reading may go on, or None if this second's time is not spent."""
        self.roll()
        if self.busy_s < self.max_busy_s:
            return None
        if not self._paused:
            self._paused = True
            self.pauses += 1
        return self.window + 1 - self.clock()


class ProbeReceiver:
    name = "probe"

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        max_processes: int = 32,
        max_layers: int = 512,
        max_kc_layers: int = 128,
        max_frames_per_s: int = 2000,
        max_receive_ms_per_s: float = 250.0,
        max_connections: int = 256,
        drain_interval_s: float = 0.025,
        idle_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.socket_path = Path(socket_path or wire.default_socket_path())
        self.stream_path = Path(wire.stream_socket_path(str(self.socket_path)))
        self._clock = clock
        self._timer = timer
        self.budget = Budget(max_frames_per_s, max_receive_ms_per_s / 1000.0, clock)
        self.frames: dict[str, int] = {"ok": 0, "malformed": 0, "unknown_version": 0, "shed": 0}
        self.last_error: str | None = None
        self.sums = ProbeSums(
            max_processes=max_processes, max_layers=max_layers, max_kc_layers=max_kc_layers,
            idle_s=idle_s, clock=clock,
        )  # fmt: skip
        self.stream = StreamServer(
            self.stream_path, self._consume_timed, max_connections=max_connections,
            interval_s=drain_interval_s, paused_s=self.budget.paused_s,
            on_truncated=lambda: self._refused("malformed", "the stream ended inside a frame"),
        )  # fmt: skip
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._shapes = ShapeCache(max_shapes=4 * max(8, max_processes))
        self._shapes4 = probe_bulk.ShapeCache(max_shapes=4 * max(8, max_processes))
        self._fast = probe_sums.enabled()
        self._bulk = True  # version 4 frames of a known shape by probe_bulk (tests: False)
        self.bulked = 0  # frames summed that way
        self._start_error: str | None = None
        self._inode: int | None = None

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Bind both sockets. A failure is reported by ``collect``, never raised here."""
        loop = asyncio.get_running_loop()
        path = self.socket_path
        try:
            sock = self._bind()
            self._sock, self._loop = sock, loop
            self._read_datagrams(True)
            path = self.stream_path
            self.stream.start(loop)
        except OSError as exc:
            self._start_error = f"cannot listen on {path}: {exc.strerror or exc}"
            log.error("probe receiver: %s", self._start_error)
        else:
            log.info("probe receiver listening on %s and %s", self.stream_path, self.socket_path)

    def _bind(self) -> socket.socket:
        path = self.socket_path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        clear_stale_socket(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            sock.bind(str(path))
            os.chmod(path, SOCKET_MODE)  # group read-write, as the stream socket
            sock.setblocking(False)
            self._inode = path.stat().st_ino
        except OSError:
            sock.close()
            raise
        return sock

    async def stop(self) -> None:
        self.stream.stop()
        if self._sock is not None:
            self._read_datagrams(False)
            self._sock.close()
            self._sock = None
            # Remove the socket file only if it is still ours (another agent may have taken it).
            with contextlib.suppress(OSError):
                if self.socket_path.stat().st_ino == self._inode:
                    os.unlink(self.socket_path)

    # -- input ---------------------------------------------------------------

    def _read_datagrams(self, on: bool) -> None:
        if self._sock is None or self._loop is None or on == self._reading:
            return
        if on:
            self._loop.add_reader(self._sock.fileno(), self._drain)
        else:
            self._loop.remove_reader(self._sock.fileno())
        self._reading = on

    def _drain(self) -> None:
        """Datagram reader callback: take every datagram waiting (up to DRAIN_MAX)."""
        sock = self._sock
        if sock is None:
            return
        recv, feed, paused_s = sock.recv, self.feed, self.budget.paused_s
        for _ in range(DRAIN_MAX):
            wait = paused_s()
            if wait is not None and self._loop is not None:  # spent: read again next second
                self._read_datagrams(False)
                self._loop.call_later(max(wait, 0.001), self._read_datagrams, True)
                return
            try:
                # One byte over the limit: a longer datagram is cut and then refused.
                data = recv(wire.MAX_FRAME_BYTES + 1)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.warning("probe socket error: %s", exc)
                break
            feed(data)

    def feed(self, data: bytes) -> None:
        """Take one datagram (one frame). Never raises: bad input is counted and dropped."""
        t0 = self._timer()
        if data[:6] == probe_bulk.V4_PREFIX:
            took = self._consume(data)
            if took != len(data):
                self._refused("malformed", f"datagram of {len(data)} bytes is not one frame")
        else:
            self._one(data)
        self.budget.busy_s += self._timer() - t0

    def _consume_timed(self, data: bytes) -> int:
        t0 = self._timer()
        try:
            return self._consume(data)
        finally:
            self.budget.busy_s += self._timer() - t0

    def _consume(self, data: bytes) -> int:
        """Take the frames in ``data`` (bytes of a stream, or a datagram); returns how many
        bytes were whole frames, or -1 if ``data`` is out of step (no frame header where
        one must start)."""
        off, end = 0, len(data)
        touched: list[Shape] = []
        try:
            while end - off >= wire.HEADER.size:
                left = self.budget.allowance()
                if left and self._bulk:
                    off, n = probe_bulk.scan(data, off, self._shapes4.get, touched, left)
                    self.budget.frames += n
                    if end - off < wire.HEADER.size:
                        break
                magic, _, length = wire.HEADER.unpack_from(data, off)
                if magic != wire.MAGIC or length > wire.MAX_FRAME_BYTES - wire.HEADER.size:
                    self._refused("malformed", f"no frame header at byte {off}: out of step")
                    return -1
                if off + wire.HEADER.size + length > end:
                    break  # the rest comes with the next read
                self._one(data[off : off + wire.HEADER.size + length])
                off += wire.HEADER.size + length
        finally:
            for shape in touched:
                self._commit(shape, data)
        return off

    def _commit(self, shape: Shape, data: bytes) -> None:
        """Frames of ``shape`` summed by ``scan``: their floats checked in bulk, then added;
        if the bulk check cannot vouch for them, each goes through ``wire.decode``."""
        offs, a, b = shape.offs, shape.a, shape.b
        shape.offs, shape.a, shape.b = [], 0, 0
        sums = probe_bulk.column_sums_of(data, shape, offs)
        if sums is None:
            for o in offs:
                self._one(data[o : o + shape.size], admitted=True)
            return
        self.sums.commit4(shape, a, b, sums, len(offs))
        self.frames["ok"] += len(offs)
        self.bulked += len(offs)

    def _one(self, data: bytes, *, admitted: bool = False) -> None:
        """One whole frame, the careful way. Past ``max_frames_per_s`` in this second it
        is shed undecoded (and counted): decoding is the costly part."""
        if not admitted and not self.budget.admit():
            self.frames["shed"] += 1
            return
        try:
            head = data[:6]
            if head == probe_bulk.V4_PREFIX:
                frame = wire.decode(data)
                if self._bulk:
                    self._shapes4.learn(data, frame)
                self.sums.add(frame)
            elif self._fast and head == probe_sums.V3_PREFIX:
                self._sum_fast(data, tagged=True)
            elif self._fast and head == probe_sums.V2_PREFIX:
                self._sum_fast(data, tagged=False)
            else:
                self.sums.add(wire.decode(data))
        except wire.WireError as exc:
            self._refused("unknown_version" if "version" in str(exc) else "malformed", str(exc))
            return
        except Exception as exc:  # a decoder bug must not kill the loop, nor flood the log
            self._refused("malformed", f"{type(exc).__name__}: {wire.excerpt(str(exc), 120)}")
            n = self.frames["malformed"]
            if n & (n - 1) == 0:
                log.error("probe: frame #%d refused by a decoder bug: %s", n, self.last_error)
            return
        self.frames["ok"] += 1

    def _refused(self, kind: str, why: str) -> None:
        self.frames[kind] += 1
        self.last_error = why
        n = self.frames[kind]
        if n & (n - 1) == 0:  # 1st, 2nd, 4th, 8th...: visible, but never a flood
            log.warning("probe: %s frame #%d dropped: %s", kind, n, why)

    def _sum_fast(self, p: bytes, tagged: bool) -> None:
        """Check a version-3 (``tagged``: engine tag first) or version-2 frame as
        ``wire.decode`` would and add it to its process's sums.

        Anything the shortcut cannot vouch for goes through ``wire.decode``, which raises
        the precise :class:`wire.WireError` (or, should the two ever disagree, returns
        the frame, which is then added the long way).
        """
        head = probe_sums.HEADER_SIZE
        tag = 1 + p[head] if tagged and len(p) > head else 0  # the engine tag's bytes
        try:
            fixed = probe_sums.FIXED.unpack_from(p, head + tag)
        except struct.error:
            self.sums.add(wire.decode(p))
            return
        pid, _seq, ts, dropped, e0, e1, e2, k, t, mask, np, ni, nl = fixed
        end = probe_sums.LABELS_START + tag + np + ni + nl
        # version bytes + engine tag + shape fields and names: one exact shape of one engine
        key = p[4:6] + p[head : head + tag] + p[probe_sums.SHAPE_START + tag : end]
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes.learn(p, key, end, k, mask, t)  # wire.decode: raises if bad
        if (
            len(p) != shape.size
            or int.from_bytes(p[6:10], "big") != len(p) - probe_sums.HEADER_SIZE
            or not 0.0 <= ts <= wire.MAX_TS
        ):
            self.sums.add(wire.decode(p))
            return
        sums = shape.sums.unpack_from(p, shape.sums_at)
        ns: tuple[int, ...] = shape.keys.unpack_from(p, shape.u32_at) if shape.keys else ()
        if not (probe_sums.sums_ok(sums) and probe_sums.keys_ok(ns)):
            self.sums.add(wire.decode(p))
            return
        proc = self.sums.proc_for(shape.label, self._clock())
        acc = proc.pending.get((shape, ns))
        if acc is None:
            if len(proc.pending) >= MAX_PENDING:
                self.sums.fold(proc)
            acc = proc.pending[(shape, ns)] = PendingSums(shape, ns)
        acc.add(int.from_bytes(p[shape.u32_at : shape.sums_at], "big"), sums)
        if acc.frames >= probe_sums.FOLD_AFTER_FRAMES:
            self.sums.fold(proc)
        if e0 or e1 or e2:
            errors = proc.errors
            errors["nan"] += e0
            errors["inf"] += e1
            errors["exception"] += e2
        self.sums.count_dropped(proc, pid, shape.instance, dropped)

    # -- output --------------------------------------------------------------

    def collect(self, now: float) -> list[Sample]:
        if self._start_error is not None:
            raise CollectorUnavailable(self._start_error, reason="listen")
        self.sums.forget_idle(self._clock())
        out: list[Sample] = [
            Sample("kcops_probe_frames_total", (("outcome", k),), float(v))
            for k, v in self.frames.items()
        ]
        out += [
            Sample("kcops_probe_connections_total", (("outcome", k),), float(v))
            for k, v in self.stream.connections.items()
        ]
        out.append(Sample("kcops_probe_connections_open", (), float(self.stream.open_connections)))
        out.append(Sample("kcops_probe_receive_paused_total", (), float(self.budget.pauses)))
        self.sums.samples(out)
        return out
