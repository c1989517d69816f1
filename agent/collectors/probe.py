"""Probe receiver: the engine's attention probe sends frames to a Unix datagram socket.

Frames (``kcops.kernels.wire``) carry per-process DELTAS since the probe's
previous frame; the receiver sums them into cumulative counters and
histograms and returns them on :meth:`ProbeReceiver.collect`. Cumulative
values stay monotonic across an engine restart (they are the agent's sums).

Cardinality is bounded: series carry ``engine`` (what the probe says it runs
in: ``vllm`` from the vLLM plugin, ``kcops`` from the reference worker,
``unknown`` from a bare probe or a frame older than version 3; 1..16 characters
of ``a-z 0-9 _ -``, checked by the decoder) and ``process`` (the process name the
probe reports, not its pid, so a restarted engine continues the same series);
past ``max_processes`` distinct (engine, process) pairs, frames fold into
``engine="other", process="other"``; past ``max_layers`` distinct layers, into
``layer="other"``. A process that
sent nothing for ``idle_s`` is forgotten (its series get staleness markers
and leave the store with retention), so a burst from many short-lived
processes does not keep feeding the store forever; its counters restart at 0
if it comes back, which Prometheus reads as a counter reset.

A datagram that is not a valid frame is counted in
``kcops_probe_frames_total{outcome="malformed"|"unknown_version"}`` and
dropped; the receiver never raises on input. Past ``max_frames_per_s`` frames
are shed undecoded (``outcome="shed"``) so a runaway publisher cannot starve
the agent's loop (a probe sends one frame per process per flush interval).
Decoding happens in the datagram callback on the event loop (no threads);
``collect`` only formats sums.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcops.agent.samples import LabelPairs, Sample, histogram_samples
from kcops.errors import CollectorUnavailable
from kcops.kernels import wire

log = logging.getLogger("kcops.agent.collectors.probe")

OTHER = "other"
MAX_LABEL = 64  # characters kept of a process or layer name sent by a probe
RCVBUF_BYTES = 4 << 20


class _Process:
    """Sums for one (``engine``, ``process``) label pair, and when its last frame came
    (monotonic s)."""

    def __init__(self, key: tuple[str, str], now: float) -> None:
        self.lp: LabelPairs = (("engine", key[0]), ("process", key[1]))
        self.calls: dict[str, int] = {}
        self.errors: dict[str, int] = dict.fromkeys(wire.ERROR_KINDS, 0)
        self.hist: dict[str, wire.Histogram] = {}
        self.topn: dict[int, wire.Histogram] = {}
        self.dropped = 0
        self.seen = now


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, receiver: ProbeReceiver) -> None:
        self.receiver = receiver

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.receiver.feed(data)

    def error_received(self, exc: Exception) -> None:
        log.warning("probe socket error: %s", exc)


class ProbeReceiver:
    name = "probe"

    def __init__(
        self,
        socket_path: str | Path | None = None,
        *,
        max_processes: int = 32,
        max_layers: int = 512,
        max_frames_per_s: int = 2000,
        idle_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.socket_path = Path(socket_path or wire.default_socket_path())
        self.max_processes = max_processes
        self.max_layers = max_layers
        self.max_frames_per_s = max_frames_per_s
        self.idle_s = idle_s
        self._clock = clock
        self._window = -1
        self._in_window = 0
        self.frames: dict[str, int] = {"ok": 0, "malformed": 0, "unknown_version": 0, "shed": 0}
        self.last_error: str | None = None
        self._procs: dict[tuple[str, str], _Process] = {}  # by (engine, process)
        # (pid, instance) -> (last seq, last cumulative dropped_total); bounded LRU.
        self._instances: OrderedDict[tuple[int, str], tuple[int, int]] = OrderedDict()
        self._transport: asyncio.DatagramTransport | None = None
        self._start_error: str | None = None
        self._inode: int | None = None

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Bind the socket. A failure is reported by ``collect``, never raised here."""
        try:
            sock = self._bind()
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)
            self._transport = transport
        except OSError as exc:
            self._start_error = f"cannot listen on {self.socket_path}: {exc.strerror or exc}"
            log.error("probe receiver: %s", self._start_error)
        else:
            log.info("probe receiver listening on %s", self.socket_path)

    def _bind(self) -> socket.socket:
        path = self.socket_path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(path.lstat().st_mode):
                path.unlink()  # a socket left by an earlier agent: the last agent wins
            else:
                raise OSError(17, f"{path} exists and is not a socket")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            sock.bind(str(path))
            sock.setblocking(False)
            self._inode = path.stat().st_ino
        except OSError:
            sock.close()
            raise
        return sock

    async def stop(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
            # Remove the socket file only if it is still ours (another agent may have taken it).
            with contextlib.suppress(OSError):
                if self.socket_path.stat().st_ino == self._inode:
                    os.unlink(self.socket_path)

    # -- input ---------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take one datagram. Never raises: bad input is counted and dropped.

        Past ``max_frames_per_s`` in one second, frames are shed undecoded (and
        counted): decoding is the costly part, and a runaway publisher must not
        take the agent's loop away from its tick.
        """
        window = int(self._clock())
        if window != self._window:
            self._window, self._in_window = window, 0
        self._in_window += 1
        if self._in_window > self.max_frames_per_s:
            self.frames["shed"] += 1
            return
        try:
            frame = wire.decode(data)
        except wire.WireError as exc:
            kind = "unknown_version" if "version" in str(exc) else "malformed"
            self.frames[kind] += 1
            self.last_error = str(exc)
            n = self.frames[kind]
            if n & (n - 1) == 0:  # 1st, 2nd, 4th, 8th...: visible, but never a flood
                log.warning("probe: %s frame #%d dropped: %s", kind, n, exc)
            return
        except Exception as exc:  # a decoder bug must not kill the loop
            self.frames["malformed"] += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.exception("probe frame decode failed")
            return
        self.frames["ok"] += 1
        self._add(frame)

    def _proc_for(self, key: tuple[str, str], now: float) -> _Process:
        p = self._procs.get(key)
        if p is None:
            if len(self._procs) >= self.max_processes:
                self._forget_idle(now)
            if len(self._procs) >= self.max_processes:
                key = (OTHER, OTHER)
                p = self._procs.get(key)
            if p is None:
                p = self._procs[key] = _Process(key, now)
        p.seen = now
        return p

    def _forget_idle(self, now: float) -> None:
        for key in [k for k, p in self._procs.items() if now - p.seen > self.idle_s]:
            del self._procs[key]

    def _add(self, f: wire.Frame) -> None:
        p = self._proc_for((f.engine, f.process[:MAX_LABEL] or "unknown"), self._clock())
        calls = p.calls
        for layer, n in f.calls_by_layer.items():
            layer = layer[:MAX_LABEL]
            if layer in calls:
                calls[layer] += n
            elif len(calls) < self.max_layers:
                calls[layer] = n
            else:
                calls[OTHER] = calls.get(OTHER, 0) + n
        for kind, n in f.errors.items():
            p.errors[kind] = p.errors.get(kind, 0) + n
        for name, h in f.histograms.items():
            acc = p.hist.get(name)
            if acc is None:
                p.hist[name] = h  # the decoder made it for this frame alone: keep it
            else:
                acc.merge(h)
        for n, h in f.topn_mass.items():
            acc = p.topn.get(n)
            if acc is None:
                if len(p.topn) < wire.MAX_TOPN:  # a short fixed list; more is a bad probe
                    p.topn[n] = h
            else:
                acc.merge(h)
        key = (f.pid, f.instance)
        last = self._instances.pop(key, None)
        last_dropped = last[1] if last is not None else 0
        # dropped_total is cumulative per probe instance; a smaller value is a new count.
        delta = (
            f.dropped_total - last_dropped if f.dropped_total >= last_dropped else f.dropped_total
        )
        p.dropped += delta
        self._instances[key] = (f.seq, f.dropped_total)
        while len(self._instances) > 8 * self.max_processes:
            self._instances.popitem(last=False)

    # -- output --------------------------------------------------------------

    def collect(self, now: float) -> list[Sample]:
        if self._start_error is not None:
            raise CollectorUnavailable(self._start_error, reason="listen")
        self._forget_idle(self._clock())
        out: list[Sample] = [
            Sample("kcops_probe_frames_total", (("outcome", k),), float(v))
            for k, v in self.frames.items()
        ]
        for p in self._procs.values():
            lp = p.lp
            eng, proc = lp  # labels stay sorted: engine < kind < layer < n < process
            for layer, n in p.calls.items():
                lp3 = (eng, ("layer", layer), proc)
                out.append(Sample("kcops_attention_calls_total", lp3, float(n)))
            for kind, n in p.errors.items():
                lp3 = (eng, ("kind", kind), proc)
                out.append(Sample("kcops_attention_errors_total", lp3, float(n)))
            for name, h in p.hist.items():
                histogram_samples(name, h, lp, out)
            for n, h in p.topn.items():
                histogram_samples(wire.TOPN_MASS, h, (eng, ("n", str(n)), proc), out)
            out.append(Sample("kcops_probe_dropped_total", lp, float(p.dropped)))
        return out
