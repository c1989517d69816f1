"""The probe's frame format: what an instrumented engine sends to the agent.

Torch-free on purpose (stdlib only): the agent's probe receiver imports this
module, and the sidecar image has no torch. docs/probe.md is the spec.

One frame is one Unix datagram::

    magic b"KCPF" | version u16 (big endian) | payload length u32 | payload

Version 3 (sent) is an engine tag (which engine the probe runs in: ``vllm``,
``kcops``, ...) followed by a version 2 payload, a compact binary payload of
fixed-width fields with explicit lengths. Version 2 (no engine: ``unknown``)
and version 1 (JSON, :mod:`wire_json`) are still read, for probes that predate
them. All are validated completely before a :class:`Frame` is returned:
counts a float64 holds exactly, finite non-negative sums, bounded counts of
layers, top-N entries and label lengths, an engine name of a closed charset.
Every count in a frame is a DELTA since the probe's previous frame, so the
receiver sums them; the one exception is ``dropped_total``, which is the
probe's cumulative count of frames it could not send. ``seq`` increases by one
per frame sent or dropped, so a gap tells the receiver how many frames it
missed (``instance`` changes when the probe restarts, and then ``seq`` starts
again at 0).
"""

from __future__ import annotations

import math
import operator
import os
import re
import struct
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

MAGIC = b"KCPF"
VERSION = 3
# Version 3 is not an extension of 2: a version-2 decoder checks the payload length
# against its own counts, so it refuses any added field as "malformed". A new number makes
# an agent that predates the engine tag say "unknown_version" instead, which names the
# cause; and this side still reads version 2 (engine "unknown").
VERSION_V2 = 2
VERSION_JSON = 1
HEADER = struct.Struct(">4sHI")
# Unix datagrams up to ~200 KB pass on Linux by default, but other systems and
# containers with small wmem defaults do not: stay well under 64 KiB.
MAX_FRAME_BYTES = 60_000

# Bounds the decoder enforces (and the encoder respects).
MAX_COUNT = 2**53  # any count: the largest integer a float64 holds exactly
MAX_SUM = 1e18  # a histogram sum in one frame (finite, so sums of sums stay finite)
MAX_TS = 1e11  # Unix seconds (year 5138)
MAX_LABEL_CHARS = 64  # process, instance and layer names
MAX_LAYERS = 4096  # layers in one frame (a bigger set is split over frames)
MAX_TOPN = 16  # top-N entries in one frame
MAX_TOPN_N = 1 << 20  # largest N of a top-N entry
MAX_ENGINE_CHARS = 16  # the engine tag: a short name, not free text

# Engine of a probe that does not say (a bare ``kcops.kernels.install()``, a version 1 or 2
# frame). The vLLM plugin says ``vllm``, the reference worker ``kcops``.
UNKNOWN_ENGINE = "unknown"
# Lower-case ASCII, a letter first: the agent exports it as the ``engine`` label, beside the
# ``engine`` label of its scrape adapters (vllm, sglang, tgi, triton, kcops).
_ENGINE = re.compile(f"[a-z][a-z0-9_-]{{0,{MAX_ENGINE_CHARS - 1}}}")
_ENGINE_BYTES = re.compile(_ENGINE.pattern.encode())

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


def format_le(bound: float) -> str:
    """A bucket bound as Prometheus (Go) writes ``le``: ``0.25``, ``16.0``, ``1e+06``, ``+Inf``.

    The same text as ``prometheus_client.utils.floatToGoString`` (a test compares them),
    here because this module must not import anything outside the stdlib.
    """
    d = float(bound)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


class WireError(ValueError):
    """A datagram is not a valid probe frame: bad magic, unknown version, truncated, bad body."""


def check_engine(name: object) -> str:
    """``name`` if it is a valid engine tag (1..16 of ``a-z 0-9 _ -``, a letter first);
    raises :class:`WireError` naming what is allowed otherwise."""
    if not isinstance(name, str) or not _ENGINE.fullmatch(name):
        raise WireError(
            f"engine {excerpt(name)} must be 1..{MAX_ENGINE_CHARS} characters of a-z, 0-9, "
            "_ or -, starting with a letter"
        )
    return name


@dataclass(slots=True)
class Histogram:
    """Non-cumulative bucket counts: ``counts[i]`` for ``bounds[i-1] < v <= bounds[i]``.

    ``counts`` has ``len(bounds) + 1`` entries; the last is the +Inf bucket. The
    count is their total, so ``_count`` always equals the ``+Inf`` bucket. The
    one histogram type of kcops: the probe fills it, frames carry it, the agent's
    probe receiver sums it and its self-metrics observe tick durations with it.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        elif len(self.counts) != len(self.bounds) + 1:
            raise WireError(
                f"histogram has {len(self.counts)} bucket counts, expected {len(self.bounds) + 1}"
            )

    @property
    def count(self) -> int:
        """How many values were observed (the +Inf bucket's cumulative count)."""
        return sum(self.counts)

    @classmethod
    def of(cls, name: str) -> Histogram:
        """An empty histogram with the fixed buckets of ``name`` (a key of :data:`BUCKETS`)."""
        return cls(BUCKETS[name])

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def merge(self, other: Histogram) -> None:
        """Add ``other`` (same bounds) into this one."""
        self.counts = list(map(operator.add, self.counts, other.counts))
        self.sum += other.sum

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, cumulative count)`` pairs as Prometheus exposes them, +Inf last."""
        out: list[tuple[float, int]] = []
        acc = 0
        for le, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            out.append((le, acc))
        return out

    def les(self) -> list[str]:
        """The ``le`` label of each bucket, +Inf last (see :func:`format_le`)."""
        return [format_le(b) for b in (*self.bounds, math.inf)]


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
    engine: str = UNKNOWN_ENGINE

    def is_empty(self) -> bool:
        """True when the frame carries no delta (a heartbeat)."""
        return (
            not any(self.calls_by_layer.values())
            and not any(self.errors.values())
            and all(h.count == 0 for h in self.histograms.values())
            and all(h.count == 0 for h in self.topn_mass.values())
        )


def excerpt(value: object, limit: int = 40) -> str:
    """A short ``repr`` of ``value`` for an error message: never a whole datagram."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else text[:limit] + "..."


def checked_histogram(
    name: str, bounds: tuple[float, ...], counts: list[int], s: float, n: int
) -> Histogram:
    """A histogram from decoded parts (version 1), refused unless consistent and in range.

    ``n`` must equal the bucket total (so no bucket exceeds :data:`MAX_COUNT`),
    and the sum must be finite, non-negative and at most :data:`MAX_SUM`.
    """
    if not n <= MAX_COUNT or sum(counts) != n:
        raise WireError(f"histogram {name}: count {excerpt(n)} is not the sum of its buckets")
    if not 0.0 <= s <= MAX_SUM:  # also false for NaN
        raise WireError(f"histogram {name}: sum {excerpt(s)} is not finite in 0..{MAX_SUM:g}")
    return Histogram(bounds, counts, s)


# Version 3 payload: engine bytes u8 | engine (ASCII, see check_engine) | a version 2 payload.
# Version 2 payload, all big endian (docs/probe.md is the spec):
#   fixed: pid u32 | seq u64 | ts f64 | dropped_total u32 | errors nan, inf, exception u32 x3
#          | layers u16 | top-N entries u8 | histogram mask u8 (bit i: PLAIN_HISTOGRAMS[i])
#          | process bytes u8 | instance bytes u8 | layer-name bytes u16
#   | process UTF-8 | instance UTF-8 | layer names, UTF-8 joined by NUL
#   | u32 block: layer counts, then the buckets of each mask histogram, then per top-N
#     entry its N and its buckets | f64 block: the sums (mask histograms, then top-N)
# Counts are deltas of one flush interval: u32 is ample, and exact in a float64, so the
# decoder needs no range check on them. A histogram's count is the sum of its buckets.
_FIXED = struct.Struct(">IQdI3IHBBBBH")
# Layer names: 1..MAX_LABEL_CHARS characters each, separated by one NUL.
_NAMES = re.compile(f"[^\\0]{{1,{MAX_LABEL_CHARS}}}(?:\\0[^\\0]{{1,{MAX_LABEL_CHARS}}})*")
MAX_U32 = 2**32 - 1


class _Layout(NamedTuple):
    """Where things are in the number blocks of one (layers, mask, top-N entries) shape."""

    numbers: struct.Struct
    slots: tuple[tuple[str, tuple[float, ...], slice], ...]  # name, bounds, buckets
    plain: tuple[str, ...]  # the mask's histograms, in order
    topn_keys: Callable[[tuple[Any, ...]], Any] | None  # the top-N entries' N from the values


@lru_cache(maxsize=1024)
def _layout(layers: int, mask: int, topn: int) -> _Layout:
    plain = tuple(n for i, n in enumerate(PLAIN_HISTOGRAMS) if mask >> i & 1)
    slots: list[tuple[str, tuple[float, ...], slice]] = []
    keys: list[int] = []
    i = layers
    for j, name in enumerate(plain + (TOPN_MASS,) * topn):
        if j >= len(plain):  # a top-N entry's N precedes its buckets
            keys.append(i)
            i += 1
        end = i + len(BUCKETS[name]) + 1
        slots.append((name, BUCKETS[name], slice(i, end)))
        i = end
    get = operator.itemgetter(*keys) if keys else None
    return _Layout(struct.Struct(f">{i}I{len(slots)}d"), tuple(slots), plain, get)


def _clip(label: str) -> bytes:
    return label.replace("\x00", "")[:MAX_LABEL_CHARS].encode()


def _payload(frame: Frame) -> bytes:
    calls: dict[bytes, int] = {}
    for layer, n in frame.calls_by_layer.items():
        key = _clip(layer) or UNKNOWN_LAYER.encode()
        calls[key] = calls.get(key, 0) + n
    if len(calls) > MAX_LAYERS or len(frame.topn_mass) > MAX_TOPN:
        raise WireError(f"frame has more than {MAX_LAYERS} layers or {MAX_TOPN} top-N entries")
    mask = 0
    for name in frame.histograms:
        if name not in PLAIN_HISTOGRAMS:
            raise WireError(f"unknown histogram {excerpt(name)}")
        mask |= 1 << PLAIN_HISTOGRAMS.index(name)
    layout = _layout(len(calls), mask, len(frame.topn_mass))
    hists = [frame.histograms[name] for name in layout.plain]
    u32 = [*calls.values()]
    for h in hists:
        u32 += h.counts
    topn = sorted(frame.topn_mass.items())  # ascending N: the decoder checks it
    for n, h in topn:
        u32.append(n)
        u32 += h.counts
    hists += [h for _, h in topn]
    if not all(0.0 <= h.sum <= MAX_SUM for h in hists):
        raise WireError(f"a histogram sum is not finite in 0..{MAX_SUM:g}")
    process, instance, layer_names = _clip(frame.process), _clip(frame.instance), b"\0".join(calls)
    return b"".join(
        (
            _FIXED.pack(frame.pid, frame.seq, frame.ts, min(frame.dropped_total, MAX_U32),
                        *(frame.errors.get(k, 0) for k in ERROR_KINDS), len(calls),
                        len(frame.topn_mass), mask, len(process), len(instance), len(layer_names)),
            process, instance, layer_names,
            layout.numbers.pack(*u32, *(h.sum for h in hists)),
        )
    )  # fmt: skip


def encode(frame: Frame) -> bytes:
    """Serialise one frame (version 3). Labels longer than :data:`MAX_LABEL_CHARS` are cut.

    Raises :class:`WireError` for a frame the decoder would refuse (a count over
    2**32 - 1 in one frame, a non-finite sum, an engine outside :func:`check_engine`)
    or one over :data:`MAX_FRAME_BYTES` (use :func:`split`).
    """
    engine = check_engine(frame.engine).encode()
    try:
        payload = _payload(frame)
    except (struct.error, OverflowError, TypeError) as exc:
        raise WireError(f"frame field out of range: {excerpt(str(exc))}") from None
    size = 1 + len(engine) + len(payload)
    data = b"".join((HEADER.pack(MAGIC, VERSION, size), bytes((len(engine),)), engine, payload))
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(data)} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    return data


def _histograms(
    vals: tuple[Any, ...], layout: _Layout
) -> tuple[dict[str, Histogram], dict[int, Histogram]]:
    """Histograms from the number blocks; the sums must be finite and non-negative."""
    slots = layout.slots
    sums = vals[len(vals) - len(slots) :]
    for s in sums:
        if not 0.0 <= s <= MAX_SUM:  # also false for NaN
            raise WireError(f"a histogram sum {excerpt(s)} is not finite in 0..{MAX_SUM:g}")
    new = Histogram.__new__
    out = []
    for (_, bounds, buckets), s in zip(slots, sums, strict=True):
        h = new(Histogram)
        h.bounds, h.counts, h.sum = bounds, list(vals[buckets]), s
        out.append(h)
    plain = len(layout.plain)
    hists = dict(zip(layout.plain, out, strict=False))
    if layout.topn_keys is None:
        return hists, {}
    ns = layout.topn_keys(vals)
    if len(layout.slots) - plain == 1:
        ns = (ns,)
    prev = 0
    for n in ns:
        if not prev < n <= MAX_TOPN_N:
            raise WireError(f"top-N keys {excerpt(ns)} are not ascending in 1..{MAX_TOPN_N}")
        prev = n
    return hists, dict(zip(ns, out[plain:], strict=True))


@lru_cache(maxsize=64)  # a few engines send all frames; a refused tag is never cached
def _engine_name(raw: bytes) -> str:
    if not _ENGINE_BYTES.fullmatch(raw):
        raise WireError(
            f"engine tag {excerpt(raw)} is not 1..{MAX_ENGINE_CHARS} characters of a-z, 0-9, "
            "_ or -, starting with a letter"
        )
    return raw.decode("ascii")


def _engine_tag(p: bytes) -> tuple[int, str]:
    """The engine tag of a version 3 datagram ``p``: (offset of its v2 body, engine)."""
    if len(p) <= HEADER.size:
        raise WireError("truncated frame: an empty payload has no engine tag")
    end = HEADER.size + 1 + p[HEADER.size]
    if end > len(p):
        raise WireError(f"truncated frame: the engine tag ends past the payload, at {end}")
    return end, _engine_name(p[HEADER.size + 1 : end])


def _decode_v2(p: bytes, start: int, engine: str) -> Frame:
    """``p`` is the whole datagram; the version 2 body starts at ``start``."""
    pid, seq, ts, dropped, e0, e1, e2, k, t, mask, np, ni, nl = _FIXED.unpack_from(p, start)
    if not 0.0 <= ts <= MAX_TS or k > MAX_LAYERS or t > MAX_TOPN or mask >> len(PLAIN_HISTOGRAMS):
        raise WireError(f"ts {excerpt(ts)}, {k} layers, {t} top-N or mask {mask} out of range")
    off = start + _FIXED.size
    process = p[off : off + np].decode()
    instance = p[off + np : off + np + ni].decode()
    text = p[off + np + ni : off + np + ni + nl].decode()
    off += np + ni + nl
    layout = _layout(k, mask, t)
    if off + layout.numbers.size != len(p):
        raise WireError(f"payload of {len(p)} bytes; its lengths and counts say otherwise")
    if (
        len(process) > MAX_LABEL_CHARS
        or len(instance) > MAX_LABEL_CHARS
        or ((k or nl) and not _NAMES.fullmatch(text))
    ):
        raise WireError(f"a label is empty, has a NUL or exceeds {MAX_LABEL_CHARS} characters")
    names = text.split("\0") if k else []
    vals = layout.numbers.unpack_from(p, off)
    calls = dict(zip(names, vals, strict=False))
    if len(calls) != k:
        raise WireError(f"{len(calls)} distinct layer names for {k} layer counts")
    hists, topn = _histograms(vals, layout)
    errors = {"nan": e0, "inf": e1, "exception": e2}
    return Frame(pid, process, seq, instance, ts, calls, errors, hists, topn, dropped, engine)


def decode(data: bytes) -> Frame:
    """Parse and validate one datagram, version 3 (or 2 and 1, JSON, from older probes).

    Raises :class:`WireError` for anything that is not a valid frame; nothing of a
    refused frame is returned, so nothing of it can reach a store.
    """
    if len(data) < HEADER.size:
        raise WireError(f"truncated frame: {len(data)} bytes, header needs {HEADER.size}")
    magic, version, length = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version not in (VERSION, VERSION_V2, VERSION_JSON):
        raise WireError(
            f"unknown frame version {version}, this side speaks "
            f"{VERSION_JSON}, {VERSION_V2}, {VERSION}"
        )
    if len(data) - HEADER.size != length:
        raise WireError(
            f"truncated frame: payload {len(data) - HEADER.size} bytes, header says {length}"
        )
    if version == VERSION_JSON:
        from kcops.kernels.wire_json import decode_v1  # it imports this module

        return decode_v1(data[HEADER.size :])
    try:
        if version == VERSION_V2:
            return _decode_v2(data, HEADER.size, UNKNOWN_ENGINE)
        return _decode_v2(data, *_engine_tag(data))
    except struct.error:
        raise WireError(f"truncated frame: payload of {length} bytes ends inside a field") from None
    except UnicodeDecodeError as exc:
        raise WireError(
            f"a label is not UTF-8: {excerpt(exc.object[exc.start : exc.end])}"
        ) from None


def split(frame: Frame) -> list[Frame]:
    """Split a frame whose encoding is too large into frames that fit.

    The first part keeps errors, histograms and dropped_total; the per-layer
    call counts are spread over the parts (at most :data:`MAX_LAYERS` each).
    ``seq`` of the parts is ``frame.seq, frame.seq + 1, ...``: the caller
    advances its sequence by ``len(result)``.
    """
    try:
        encode(frame)
        return [frame]
    except WireError:
        if len(frame.calls_by_layer) <= 1:
            raise
    # Histograms, labels and errors take under 2 KB; each layer its name, a NUL and 8 bytes.
    budget = MAX_FRAME_BYTES - 4_000
    chunks: list[dict[str, int]] = [{}]
    used = 0
    for layer, n in frame.calls_by_layer.items():
        size = len(_clip(layer)) + 9
        if (used + size > budget or len(chunks[-1]) >= MAX_LAYERS) and chunks[-1]:
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
                engine=frame.engine,
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
