"""The probe's frame format: what an instrumented engine sends to the agent.

Torch-free on purpose (stdlib only): the agent's probe receiver imports this
module, and the sidecar image has no torch. docs/probe.md is the spec.

One frame is one Unix datagram::

    magic b"KCPF" | version u16 (big endian) | payload length u32 | payload

The payload is UTF-8 JSON (compact separators). Every count in a frame is a
DELTA since the probe's previous frame, so the receiver sums them; the one
exception is ``dropped_total``, which is the probe's cumulative count of frames
it could not send. ``seq`` increases by one per frame sent or dropped, so a gap
tells the receiver how many frames it missed (``instance`` changes when the
probe restarts, and then ``seq`` starts again at 0).
"""

from __future__ import annotations

import json
import os
import struct
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

MAGIC = b"KCPF"
VERSION = 1
HEADER = struct.Struct(">4sHI")
# Unix datagrams up to ~200 KB pass on Linux by default, but other systems and
# containers with small wmem defaults do not: stay well under 64 KiB.
MAX_FRAME_BYTES = 60_000

ERROR_KINDS: tuple[str, ...] = ("nan", "inf", "exception")

ATTENTION_SECONDS = "kcops_attention_seconds"
KC_TOKENS = "kcops_kc_tokens"
KC_RATIO = "kcops_kc_ratio"
CONTEXT_TOKENS = "kcops_context_tokens"
TOPN_MASS = "kcops_topn_mass_ratio"

# Fixed bucket upper bounds (Prometheus ``le``) of each histogram; +Inf is
# implicit and always the last count. Changing any of these needs a new VERSION.
BUCKETS: dict[str, tuple[float, ...]] = {
    ATTENTION_SECONDS: (
        1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ),
    KC_TOKENS: (
        1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768, 65536, 131072,
    ),
    KC_RATIO: (
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3,
        0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0,
    ),
    CONTEXT_TOKENS: (
        16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
        65536, 131072, 262144,
    ),
    TOPN_MASS: (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99, 1.0),
}  # fmt: skip

# Histograms without labels, in the order they appear in a frame.
PLAIN_HISTOGRAMS: tuple[str, ...] = (ATTENTION_SECONDS, KC_TOKENS, KC_RATIO, CONTEXT_TOKENS)

# Layer label of calls whose layer index the integration cannot know.
UNKNOWN_LAYER = "unknown"


class WireError(ValueError):
    """A datagram is not a valid probe frame: bad magic, unknown version, truncated, bad body."""


@dataclass
class Histogram:
    """Non-cumulative bucket counts: ``counts[i]`` for ``bounds[i-1] < v <= bounds[i]``.

    ``counts`` has ``len(bounds) + 1`` entries; the last is the +Inf bucket.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        elif len(self.counts) != len(self.bounds) + 1:
            raise WireError(
                f"histogram has {len(self.counts)} bucket counts, expected {len(self.bounds) + 1}"
            )

    @classmethod
    def of(cls, name: str) -> Histogram:
        """An empty histogram with the fixed buckets of ``name`` (a key of :data:`BUCKETS`)."""
        return cls(BUCKETS[name])

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def merge(self, other: Histogram) -> None:
        for i, c in enumerate(other.counts):
            self.counts[i] += c
        self.sum += other.sum
        self.count += other.count

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, cumulative count)`` pairs as Prometheus exposes them, +Inf last."""
        out: list[tuple[float, int]] = []
        acc = 0
        for le, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            out.append((le, acc))
        return out


@dataclass
class Frame:
    """What one probe (one process) saw since its previous frame."""

    pid: int
    process: str
    seq: int
    instance: str = ""
    ts: float = 0.0
    calls_by_layer: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    topn_mass: dict[int, Histogram] = field(default_factory=dict)
    dropped_total: int = 0

    def is_empty(self) -> bool:
        """True when the frame carries no delta (a heartbeat)."""
        return (
            not any(self.calls_by_layer.values())
            and not any(self.errors.values())
            and all(h.count == 0 for h in self.histograms.values())
            and all(h.count == 0 for h in self.topn_mass.values())
        )


def _hist_json(h: Histogram) -> dict[str, Any]:
    return {"c": h.counts, "s": h.sum, "n": h.count}


def encode(frame: Frame) -> bytes:
    """Serialise one frame. Raises :class:`WireError` if it exceeds :data:`MAX_FRAME_BYTES`
    (use :func:`split` first)."""
    body = {
        "pid": frame.pid,
        "process": frame.process,
        "seq": frame.seq,
        "instance": frame.instance,
        "ts": frame.ts,
        "calls": frame.calls_by_layer,
        "errors": frame.errors,
        "hist": {name: _hist_json(h) for name, h in frame.histograms.items()},
        "topn": {str(n): _hist_json(h) for n, h in frame.topn_mass.items()},
        "dropped_total": frame.dropped_total,
    }
    payload = json.dumps(body, separators=(",", ":"), allow_nan=False).encode()
    data = HEADER.pack(MAGIC, VERSION, len(payload)) + payload
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(data)} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    return data


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise WireError(f"{what}: expected a non-negative integer, got {v!r}")
    return v


def _hist(name: str, raw: Any) -> Histogram:
    if name not in BUCKETS:
        raise WireError(f"unknown histogram {name!r}")
    if not isinstance(raw, dict) or not isinstance(raw.get("c"), list):
        raise WireError(f"histogram {name}: expected an object with c, s, n")
    counts = [_int(c, f"{name} bucket") for c in raw["c"]]
    s = raw.get("s")
    if isinstance(s, bool) or not isinstance(s, int | float):
        raise WireError(f"histogram {name}: sum must be a number")
    return Histogram(BUCKETS[name], counts, float(s), _int(raw.get("n"), f"{name} count"))


def decode(data: bytes) -> Frame:
    """Parse one datagram. Raises :class:`WireError` for anything that is not a valid frame."""
    if len(data) < HEADER.size:
        raise WireError(f"truncated frame: {len(data)} bytes, header needs {HEADER.size}")
    magic, version, length = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise WireError(f"unknown frame version {version}, this side speaks {VERSION}")
    payload = data[HEADER.size :]
    if len(payload) != length:
        raise WireError(f"truncated frame: payload {len(payload)} bytes, header says {length}")
    try:
        body = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"frame payload is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise WireError("frame payload must be a JSON object")
    try:
        calls = body.get("calls", {})
        errors = body.get("errors", {})
        hist = body.get("hist", {})
        topn = body.get("topn", {})
        if not all(isinstance(x, dict) for x in (calls, errors, hist, topn)):
            raise WireError("calls, errors, hist and topn must be objects")
        process = body.get("process", "")
        instance = body.get("instance", "")
        ts = body.get("ts", 0.0)
        if not isinstance(process, str) or not isinstance(instance, str):
            raise WireError("process and instance must be strings")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise WireError("ts must be a number")
        frame = Frame(
            pid=_int(body.get("pid"), "pid"),
            process=process,
            seq=_int(body.get("seq"), "seq"),
            instance=instance,
            ts=float(ts),
            calls_by_layer={str(k): _int(v, f"calls[{k}]") for k, v in calls.items()},
            errors={},
            histograms={name: _hist(name, raw) for name, raw in hist.items()},
            topn_mass={int(n): _hist(TOPN_MASS, raw) for n, raw in topn.items()},
            dropped_total=_int(body.get("dropped_total", 0), "dropped_total"),
        )
        for kind, v in errors.items():
            if kind not in ERROR_KINDS:
                raise WireError(f"unknown error kind {kind!r}, allowed: {', '.join(ERROR_KINDS)}")
            frame.errors[kind] = _int(v, f"errors[{kind}]")
    except ValueError as exc:  # includes WireError and int() of a bad top-N key
        if isinstance(exc, WireError):
            raise
        raise WireError(f"bad frame field: {exc}") from None
    return frame


def split(frame: Frame) -> list[Frame]:
    """Split a frame whose encoding is too large into frames that fit.

    The first part keeps errors, histograms and dropped_total; the per-layer
    call counts are spread over the parts. ``seq`` of the parts is
    ``frame.seq, frame.seq + 1, ...``: the caller advances its sequence by
    ``len(result)``.
    """
    try:
        encode(frame)
        return [frame]
    except WireError:
        pass
    # Histograms and errors are bounded (a few KB); spread the layers by their JSON size.
    budget = MAX_FRAME_BYTES - 8_000
    chunks: list[dict[str, int]] = [{}]
    used = 0
    for layer, n in frame.calls_by_layer.items():
        size = len(json.dumps(layer)) + len(str(n)) + 2
        if used + size > budget and chunks[-1]:
            chunks.append({})
            used = 0
        chunks[-1][layer] = n
        used += size
    parts: list[Frame] = []
    for calls in chunks:
        first = not parts
        parts.append(
            Frame(
                pid=frame.pid,
                process=frame.process,
                seq=frame.seq + len(parts),
                instance=frame.instance,
                ts=frame.ts,
                calls_by_layer=calls,
                errors=frame.errors if first else {},
                histograms=frame.histograms if first else {},
                topn_mass=frame.topn_mass if first else {},
                dropped_total=frame.dropped_total,
            )
        )
    return parts


def default_socket_path() -> str:
    """Where the probe sends and the agent listens.

    ``$KCOPS_PROBE_SOCKET``, else ``$XDG_RUNTIME_DIR/kcops/probe.sock``, else
    ``/tmp/kcops-<uid>/probe.sock``. The directory is not created here.
    """
    explicit = os.environ.get("KCOPS_PROBE_SOCKET", "").strip()
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    if runtime:
        return os.path.join(runtime, "kcops", "probe.sock")
    return os.path.join("/tmp", f"kcops-{os.getuid()}", "probe.sock")
