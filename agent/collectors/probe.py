"""Probe receiver: the engine's attention probe sends frames to the agent.

Probes connect to one Unix stream socket (``kcops.kernels.wire.default_socket_path()``
unless configured) and write frames (``kcops.kernels.wire``, its one version) on it;
:mod:`probe_stream` reads every connection in bulk every ``drain_interval_s``.

Frames carry per-process DELTAS since the probe's previous frame; :mod:`probe_state`
sums them into cumulative counters and histograms per (engine, process), within
cardinality bounds (no one connection's peer can fill the process slots, and the engine
the agent supervises always has one), and :meth:`ProbeReceiver.collect` returns them.
Series carry
``engine`` (what the probe says it runs in: ``vllm`` from the vLLM plugin, ``kcops``
from the reference worker, ``unknown`` from a bare probe) and ``process`` (the process
name the probe reports, not its pid, so a restarted engine continues the same series);
K(C) (``kcops_kc_tokens``) also ``layer``.

A frame that is not valid is dropped and counted by the type of its
:class:`wire.WireError`: ``kcops_probe_frames_total{outcome="malformed"|"unknown_version"}``
and ``kcops_probe_frames_refused_total{reason}`` (``truncated``, ``bad_magic``,
``bad_version``, ``bad_field``, ``too_large``, ``decoder_bug``); the receiver never
raises on input. Receiving is bounded in cost as well as in count, so a runaway or
hostile publisher cannot starve the agent's loop: past ``max_frames_per_s`` frames in
one second the rest are shed undecoded (``outcome="shed"``), and once the receiver has
spent ``max_receive_ms_per_s`` of that second it stops reading until the next one
(``kcops_probe_receive_paused_total``; the probes' queues fill, and they drop and count
frames without ever waiting). Everything runs on the event loop (no threads). Frames
of a shape seen before are summed in bulk (:mod:`probe_bulk`); the first frame of each
shape, and any the bulk check cannot vouch for, by ``wire.decode``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kcops.agent.collectors import probe_bulk
from kcops.agent.collectors.probe_bulk import Shape
from kcops.agent.collectors.probe_state import ProbeSums
from kcops.agent.collectors.probe_stream import StreamServer
from kcops.agent.cost import cost_samples
from kcops.agent.quotas import probe_source
from kcops.agent.samples import Sample
from kcops.errors import CollectorUnavailable
from kcops.kernels import wire

log = logging.getLogger("kcops.agent.collectors.probe")


class DecoderBug(wire.WireError):
    """A decoder raised something other than a :class:`wire.WireError`: a bug, counted as
    a malformed frame so that it never stops the loop."""

    reason = "decoder_bug"


class StreamEnded(wire.Truncated):
    """A connection closed inside a frame: the rest of it never comes."""


class ReceiveBudget:
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
    source_of = staticmethod(probe_source)  # each process's series count against its own budget

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
        connection_idle_timeout_s: float = 60.0,
        partial_frame_timeout_s: float = 10.0,
        drain_interval_s: float = 0.025,
        idle_s: float = 600.0,
        series_share: int = 1 << 62,
        engine_pids: Callable[[], set[int]] = set,
        prices: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.socket_path = Path(socket_path or wire.default_socket_path())
        self._clock = clock
        self._timer = timer
        self.prices = prices or {}  # per 1,000 context tokens, by model (kcops.agent.cost)
        self.budget = ReceiveBudget(max_frames_per_s, max_receive_ms_per_s / 1000.0, clock)
        self.frames: dict[str, int] = {"ok": 0, "malformed": 0, "unknown_version": 0, "shed": 0}
        self.refused: dict[str, int] = {}  # by the reason of the error's type
        self.last_error: str | None = None
        self.sums = ProbeSums(
            max_processes=max_processes, max_layers=max_layers, max_kc_layers=max_kc_layers,
            idle_s=idle_s, clock=clock, share=series_share, engine_pids=engine_pids,
        )  # fmt: skip
        self.stream = StreamServer(
            self.socket_path, self._consume_timed, max_connections=max_connections,
            interval_s=drain_interval_s, paused_s=self.budget.paused_s,
            on_truncated=lambda: self._refused(StreamEnded("the stream ended inside a frame")),
            idle_timeout_s=connection_idle_timeout_s, partial_timeout_s=partial_frame_timeout_s,
            clock=clock,
        )  # fmt: skip
        self._shapes = probe_bulk.ShapeCache(max_shapes=4 * max(8, max_processes))
        self._bulk = True  # frames of a known shape by probe_bulk (tests: False)
        self.bulked = 0  # frames summed that way
        self._start_error: str | None = None

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Listen. A failure is reported by ``collect``, never raised here."""
        path = self.socket_path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.stream.start(asyncio.get_running_loop())
        except OSError as exc:
            self._start_error = f"cannot listen on {path}: {exc.strerror or exc}"
            log.error("probe receiver: %s", self._start_error)
        else:
            log.info("probe receiver listening on %s", path)

    async def stop(self) -> None:
        self.stream.stop()

    # -- input ---------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take the bytes of whole frames, as a connection would deliver them (tests and
        benchmarks). Never raises: bad input is counted and dropped, and so is a frame
        that ``data`` ends inside."""
        if not data or self._consume_timed(data) not in (-1, len(data)):
            self._refused(StreamEnded(f"{len(data)} bytes end inside a frame"))

    def _consume_timed(self, data: bytes, peer: int | None = None) -> int:
        """``_consume`` of the bytes of ``peer``'s connection (None: fed), timed."""
        t0 = self._timer()
        self.sums.peer = peer
        try:
            return self._consume(data)
        finally:
            self.budget.busy_s += self._timer() - t0

    def _consume(self, data: bytes) -> int:
        """Take the frames in ``data`` (bytes of a stream); returns how many bytes were
        whole frames, or -1 if ``data`` is out of step (no frame header where one must
        start, or one that says more than a frame may hold)."""
        off, end = 0, len(data)
        touched: list[Shape] = []
        try:
            while end - off >= wire.HEADER.size:
                left = self.budget.allowance()
                if left and self._bulk:
                    off, n = probe_bulk.scan(data, off, self._shapes.get, touched, left)
                    self.budget.frames += n
                    if end - off < wire.HEADER.size:
                        break
                try:
                    _, length = wire.header(data, off)
                except wire.WireError as exc:
                    self._refused(exc)
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
        self.sums.commit(shape, a, b, sums, len(offs))
        self.frames["ok"] += len(offs)
        self.bulked += len(offs)

    def _one(self, data: bytes, *, admitted: bool = False) -> None:
        """One whole frame, the careful way. Past ``max_frames_per_s`` in this second it
        is shed undecoded (and counted): decoding is the costly part."""
        if not admitted and not self.budget.admit():
            self.frames["shed"] += 1
            return
        try:
            frame = wire.decode(data)
        except wire.WireError as exc:
            self._refused(exc)
            return
        except Exception as exc:  # a decoder bug must not kill the loop, nor flood the log
            self._refused(DecoderBug(f"{type(exc).__name__}: {wire.excerpt(str(exc), 120)}"))
            n = self.refused[DecoderBug.reason]
            if n & (n - 1) == 0:
                log.error("probe: frame #%d refused by a decoder bug: %s", n, self.last_error)
            return
        if self._bulk:
            self._shapes.learn(data, frame)
        self.sums.add(frame)
        self.frames["ok"] += 1

    def _refused(self, exc: wire.WireError) -> None:
        kind = exc.outcome
        self.frames[kind] += 1
        self.refused[exc.reason] = self.refused.get(exc.reason, 0) + 1
        self.last_error = str(exc)
        n = self.frames[kind]
        if n & (n - 1) == 0:  # 1st, 2nd, 4th, 8th...: visible, but never a flood
            log.warning("probe: %s frame #%d dropped (%s): %s", kind, n, exc.reason, exc)

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
            Sample("kcops_probe_frames_refused_total", (("reason", k),), float(v))
            for k, v in sorted(self.refused.items())
        ]
        out += [
            Sample("kcops_probe_connections_total", (("outcome", k),), float(v))
            for k, v in self.stream.connections.items()
        ]
        out.append(Sample("kcops_probe_connections_open", (), float(self.stream.open_connections)))
        out.append(Sample("kcops_probe_buffered_bytes", (), float(self.stream.buffered_bytes)))
        out += [
            Sample.of("kcops_collector_errors_total", float(n), {"collector": "probe", "reason": k})
            for k, n in sorted(self.stream.repeats.counts.items())
        ]
        out.append(Sample("kcops_probe_receive_paused_total", (), float(self.budget.pauses)))
        out += [
            Sample("kcops_probe_folded_frames_total", (("source", k),), float(v))
            for k, v in sorted(self.sums.folded.items())
        ]
        out.append(Sample("kcops_probe_slots_replaced_total", (), float(self.sums.replaced)))
        self.sums.samples(out)
        out += cost_samples(out, self.prices)  # vLLM's requests, priced as the worker's are
        return out
