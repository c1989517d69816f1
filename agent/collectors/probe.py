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
Frames are read on the event loop (no threads): one reader callback drains
every datagram waiting on the socket, and version-2 frames whose labels were
seen before are checked and summed without building a ``Frame``
(:mod:`probe_sums`); ``collect`` folds those sums in and formats them.
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
from collections import OrderedDict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

from kcops.agent.collectors import probe_sums
from kcops.agent.collectors.probe_sums import PendingSums, Shape, ShapeCache
from kcops.agent.samples import LabelPairs, Sample, histogram_samples
from kcops.errors import CollectorUnavailable
from kcops.kernels import wire

log = logging.getLogger("kcops.agent.collectors.probe")

OTHER = "other"
MAX_LABEL = 64  # characters kept of a process or layer name sent by a probe
RCVBUF_BYTES = 4 << 20
K = TypeVar("K", str, int)
# Datagrams read per reader callback: enough to empty a busy socket in a few
# callbacks, few enough that a flood cannot hold the loop for long.
DRAIN_MAX = 256
# The reader is not paused between callbacks to gather bigger batches: Linux queues
# at most net.unix.max_dgram_qlen (often 10) datagrams on a socket, so a paused
# reader makes probes drop frames at 10,000 frames/s (tried: more drops, no CPU saved).
MAX_PENDING = 64  # shapes summed per process before they are folded in early


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
        # Version-2 frames summed but not yet folded into the dicts above.
        self.pending: dict[tuple[Shape, tuple[int, ...]], PendingSums] = {}


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
        # (pid, instance) -> its last cumulative dropped_total; bounded LRU.
        self._instances: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shapes = ShapeCache(max_shapes=4 * max(8, max_processes))
        self._fast = probe_sums.enabled()
        self._start_error: str | None = None
        self._inode: int | None = None

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Bind the socket. A failure is reported by ``collect``, never raised here."""
        try:
            sock = self._bind()
            loop = asyncio.get_running_loop()
            loop.add_reader(sock.fileno(), self._drain)
            self._sock, self._loop = sock, loop
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
        if self._sock is not None:
            assert self._loop is not None
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
            # Remove the socket file only if it is still ours (another agent may have taken it).
            with contextlib.suppress(OSError):
                if self.socket_path.stat().st_ino == self._inode:
                    os.unlink(self.socket_path)

    # -- input ---------------------------------------------------------------

    def _drain(self) -> None:
        """Reader callback: take every datagram waiting (up to DRAIN_MAX), not one per wake-up."""
        sock = self._sock
        if sock is None:
            return
        recv, feed = sock.recv, self.feed
        for _ in range(DRAIN_MAX):
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
            head = data[:6]
            if self._fast and head == probe_sums.V3_PREFIX:
                self._sum_fast(data, tagged=True)
            elif self._fast and head == probe_sums.V2_PREFIX:
                self._sum_fast(data, tagged=False)
            else:
                self._add(wire.decode(data))
        except wire.WireError as exc:
            kind = "unknown_version" if "version" in str(exc) else "malformed"
            self.frames[kind] += 1
            self.last_error = str(exc)
            n = self.frames[kind]
            if n & (n - 1) == 0:  # 1st, 2nd, 4th, 8th...: visible, but never a flood
                log.warning("probe: %s frame #%d dropped: %s", kind, n, exc)
            return
        except Exception as exc:  # a decoder bug must not kill the loop, nor flood the log
            self.frames["malformed"] += 1
            self.last_error = f"{type(exc).__name__}: {wire.excerpt(str(exc), 120)}"
            n = self.frames["malformed"]
            if n & (n - 1) == 0:
                log.error("probe: frame #%d refused by a decoder bug: %s", n, self.last_error)
            return
        self.frames["ok"] += 1

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
            self._add(wire.decode(p))
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
            self._add(wire.decode(p))
            return
        sums = shape.sums.unpack_from(p, shape.sums_at)
        ns: tuple[int, ...] = shape.keys.unpack_from(p, shape.u32_at) if shape.keys else ()
        if not (probe_sums.sums_ok(sums) and probe_sums.keys_ok(ns)):
            self._add(wire.decode(p))
            return
        proc = self._procs.get(shape.label)
        if proc is None:
            proc = self._proc_for(shape.label, self._clock())
        else:
            proc.seen = self._window  # whole seconds are precise enough for idle_s
        acc = proc.pending.get((shape, ns))
        if acc is None:
            if len(proc.pending) >= MAX_PENDING:
                self._fold(proc)
            acc = proc.pending[(shape, ns)] = PendingSums(shape, ns)
        acc.add(int.from_bytes(p[shape.u32_at : shape.sums_at], "big"), sums)
        if acc.frames >= probe_sums.FOLD_AFTER_FRAMES:
            self._fold(proc)
        if e0 or e1 or e2:
            errors = proc.errors
            errors["nan"] += e0
            errors["inf"] += e1
            errors["exception"] += e2
        self._count_dropped(proc, pid, shape.instance, dropped)

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
        self._add_calls(p, f.calls_by_layer.items())
        for kind, n in f.errors.items():
            p.errors[kind] = p.errors.get(kind, 0) + n
        for name, h in f.histograms.items():
            self._add_hist(p.hist, name, h)
        for n, h in f.topn_mass.items():
            self._add_hist(p.topn, n, h)
        self._count_dropped(p, f.pid, f.instance, f.dropped_total)

    def _add_calls(self, p: _Process, items: Iterable[tuple[str, int]]) -> None:
        calls = p.calls
        for layer, n in items:
            layer = layer[:MAX_LABEL]
            if layer in calls:
                calls[layer] += n
            elif len(calls) < self.max_layers:
                calls[layer] = n
            else:
                calls[OTHER] = calls.get(OTHER, 0) + n

    @staticmethod
    def _add_hist(into: dict[K, wire.Histogram], key: K, h: wire.Histogram) -> None:
        acc = into.get(key)
        if acc is None:
            # A short fixed list (top-N entries); more is a bad probe. ``h`` was made for
            # this frame alone: keep it.
            if len(into) < wire.MAX_TOPN:
                into[key] = h
        else:
            acc.merge(h)

    def _count_dropped(self, p: _Process, pid: int, instance: str, total: int) -> None:
        instances = self._instances
        key = (pid, instance)
        last = instances.pop(key, 0)
        instances[key] = total
        if total != last:
            # dropped_total is cumulative per probe instance; a smaller value is a new count.
            p.dropped += total - last if total > last else total
        while len(instances) > 8 * self.max_processes:
            instances.popitem(last=False)

    def _fold(self, p: _Process) -> None:
        """Move the pending version-2 sums of ``p`` into its counters and histograms."""
        pending, p.pending = p.pending, {}
        for acc in pending.values():
            shape, counters = acc.shape, acc.counters()
            self._add_calls(p, zip(shape.names, counters, strict=False))
            for j, (name, bounds, buckets) in enumerate(shape.slots):
                h = wire.Histogram(bounds, counters[buckets], acc.sums[j])
                if j < shape.plain:
                    self._add_hist(p.hist, name, h)
                else:
                    self._add_hist(p.topn, acc.ns[j - shape.plain], h)

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
            if p.pending:
                self._fold(p)
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
