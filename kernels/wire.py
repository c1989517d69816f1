"""The probe's frame format: what an instrumented engine sends to the agent.

Torch-free on purpose (stdlib only): the agent's probe receiver imports this
module, and the sidecar image has no torch. docs/probe.md is the spec.

Every frame starts with the same header::

    magic b"KCPF" | version u16 (big endian) | payload length u32 | payload

Version 4 (sent) is a compact binary payload in two parts: a *key* (pid, the
counts that fix the frame's shape, the top-N entries' N, the engine, process,
instance and layer names), which stays byte for byte the same from one frame of a
probe to the next, and the *numbers* (seq, a block of u32 counters, a block of
float64 sums). The key comes first and says its own length, so a receiver can
recognise a frame it has seen the shape of by one lookup and add its numbers
without parsing the rest. Versions 3 and 2 (:mod:`wire_v3`) and 1 (JSON,
:mod:`wire_json`) are still read, for probes that predate version 4. All are
validated completely before a :class:`Frame` is returned: counts a float64 holds
exactly, finite non-negative sums, bounded counts of layers, top-N entries and
label lengths, labels of valid UTF-8, an engine name of a closed charset.

Every count in a frame is a DELTA since the probe's previous frame, so the
receiver sums them (versions before 4 carried ``dropped_total``, cumulative).
``seq`` increases by one per frame sent or dropped, so a gap tells the receiver
how many frames it missed (``instance`` changes when the probe restarts, and then
``seq`` starts again at 0).

Version 4 adds the probe's internal errors (failures of its own measuring) and
K(C) by layer: ``kcops_kc_tokens`` per layer name, which a probe sends every few
flushes (its histograms summed in between), since one such histogram per layer
makes a frame several times larger.
"""

from __future__ import annotations

import math
import operator
import os
import re
import struct
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

MAGIC = b"KCPF"
VERSION = 4
# Versions still read. A new number rather than fields added to the last: each version's
# decoder checks the payload length against its own counts, so an agent that predates a
# version counts its frames as "unknown_version", which names the cause.
VERSION_V3 = 3
VERSION_V2 = 2
VERSION_JSON = 1
HEADER = struct.Struct(">4sHI")
# Unix datagrams up to ~200 KB pass on Linux by default, but other systems and
# containers with small wmem defaults do not: stay well under 64 KiB.
MAX_FRAME_BYTES = 60_000

# Bounds the decoder enforces (and the encoder respects).
MAX_COUNT = 2**53  # any count: the largest integer a float64 holds exactly
MAX_U32 = 2**32 - 1  # a count of one frame (a delta of one flush interval)
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


@lru_cache(maxsize=64)  # a few engines send all frames; a refused tag is never cached
def engine_name(raw: bytes) -> str:
    """The engine of a tag's bytes; raises :class:`WireError` unless :func:`check_engine`
    would accept it."""
    if not _ENGINE_BYTES.fullmatch(raw):
        raise WireError(
            f"engine tag {excerpt(raw)} is not 1..{MAX_ENGINE_CHARS} characters of a-z, 0-9, "
            "_ or -, starting with a letter"
        )
    return raw.decode("ascii")


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
    dropped_total: int = 0  # cumulative (versions 1 to 3); version 4 sends ``dropped``
    engine: str = UNKNOWN_ENGINE
    # Version 4 only: K(C) (``kcops_kc_tokens``) by layer name, the probe's own failures,
    # and the frames it dropped since its previous frame (a delta).
    kc_by_layer: dict[str, Histogram] = field(default_factory=dict)
    internal_errors: int = 0
    dropped: int = 0

    def is_empty(self) -> bool:
        """True when the frame carries no delta (a heartbeat)."""
        return (
            not any(self.calls_by_layer.values())
            and not any(self.errors.values())
            and not self.internal_errors
            and all(h.count == 0 for h in self.histograms.values())
            and all(h.count == 0 for h in self.topn_mass.values())
            and all(h.count == 0 for h in self.kc_by_layer.values())
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


# Version 4 payload, all big endian (docs/probe.md is the spec):
#   key bytes u16 | key | numbers
#   key: pid u32 | layers u16 | top-N entries u8 | mask u8 | engine, process, instance bytes
#        u8 x3 | layer-name bytes u16 | N of each top-N entry u32, ascending
#        | engine ASCII | process UTF-8 | instance UTF-8 | layer names, UTF-8 joined by NUL
#   numbers: seq u64
#        | u32 block: errors nan, inf, exception | internal errors | dropped | one count per
#          layer | with mask bit 4, per layer the buckets of its kcops_kc_tokens | the
#          buckets of each mask histogram (bits 0-3: PLAIN_HISTOGRAMS) | those of each top-N
#        | f64 block: ts | with bit 4, per layer its K(C) sum | the sums of the mask
#          histograms | those of the top-N entries
# Counts are deltas of one flush interval: u32 is ample, and exact in a float64, so the
# decoder needs no range check on them. A histogram's count is the sum of its buckets.
KEY_FIXED = struct.Struct(">IHBBBBBH")
KEY_LENGTH = struct.Struct(">H")
KC_LAYERS_BIT = 1 << len(PLAIN_HISTOGRAMS)  # mask bit 4: per-layer K(C)
LEADING_LANES = 5  # nan, inf, exception, internal, dropped
_NAMES = re.compile(f"[^\\0]{{1,{MAX_LABEL_CHARS}}}(?:\\0[^\\0]{{1,{MAX_LABEL_CHARS}}})*")


class Layout(NamedTuple):
    """Where things are in the numbers of one (layers, mask, top-N entries) shape: indices
    into the u32 block (``lanes``) and into the f64 block (``floats``, ts first)."""

    numbers: struct.Struct  # seq, the u32 block, the f64 block
    lanes: int
    floats: int
    kc: tuple[slice, ...]  # each layer's kcops_kc_tokens buckets (mask bit 4), else ()
    hists: tuple[tuple[str, slice, int], ...]  # mask histograms, then top-N: name, buckets, sum
    plain: int  # how many of ``hists`` are mask histograms


@lru_cache(maxsize=1024)
def layout(layers: int, mask: int, topn: int) -> Layout:
    lane = LEADING_LANES + layers
    flt = 1
    kc: list[slice] = []
    if mask & KC_LAYERS_BIT:
        width = len(BUCKETS[KC_TOKENS]) + 1
        kc = [slice(lane + i * width, lane + (i + 1) * width) for i in range(layers)]
        lane += layers * width
        flt += layers
    names = [n for i, n in enumerate(PLAIN_HISTOGRAMS) if mask >> i & 1] + [TOPN_MASS] * topn
    hists: list[tuple[str, slice, int]] = []
    for name in names:
        end = lane + len(BUCKETS[name]) + 1
        hists.append((name, slice(lane, end), flt))
        lane, flt = end, flt + 1
    numbers = struct.Struct(f">Q{lane}I{flt}d")
    return Layout(numbers, lane, flt, tuple(kc), tuple(hists), len(names) - topn)


def clip(label: str) -> bytes:
    """A label as a frame carries it: no NUL, at most :data:`MAX_LABEL_CHARS` characters."""
    return label.replace("\x00", "")[:MAX_LABEL_CHARS].encode()


def _layers(frame: Frame) -> tuple[dict[bytes, int], dict[bytes, Histogram]]:
    """Calls and K(C) by clipped layer name (names that clip alike are summed); every K(C)
    layer is in the calls (with 0 calls if it ran none since the last frame)."""
    unknown = UNKNOWN_LAYER.encode()
    calls: dict[bytes, int] = {}
    for layer, n in frame.calls_by_layer.items():
        key = clip(layer) or unknown
        calls[key] = calls.get(key, 0) + n
    kc: dict[bytes, Histogram] = {}
    for layer, h in frame.kc_by_layer.items():
        key = clip(layer) or unknown
        calls.setdefault(key, 0)
        acc = kc.get(key)
        if acc is None:
            kc[key] = Histogram(h.bounds, list(h.counts), h.sum)
        else:
            acc.merge(h)
    if len(calls) > MAX_LAYERS or len(frame.topn_mass) > MAX_TOPN:
        raise WireError(f"frame has more than {MAX_LAYERS} layers or {MAX_TOPN} top-N entries")
    return calls, kc


def _numbers(frame: Frame, calls: dict[bytes, int], kc: dict[bytes, Histogram],
             lay: Layout, hists: list[Histogram]) -> bytes:  # fmt: skip
    errors = [frame.errors.get(k, 0) for k in ERROR_KINDS]
    lanes = [*errors, frame.internal_errors, min(frame.dropped, MAX_U32), *calls.values()]
    floats = [frame.ts]
    if lay.kc:
        empty = [0] * (len(BUCKETS[KC_TOKENS]) + 1)
        for name in calls:
            h = kc.get(name)
            lanes += empty if h is None else h.counts
            floats.append(0.0 if h is None else h.sum)
    for h in hists:
        lanes += h.counts
        floats.append(h.sum)
    if not all(0.0 <= s <= MAX_SUM for s in floats[1:]):  # also false for NaN
        raise WireError(f"a histogram sum is not finite in 0..{MAX_SUM:g}")
    return lay.numbers.pack(frame.seq, *lanes, *floats)


def encode(frame: Frame) -> bytes:
    """Serialise one frame (version 4). Labels longer than :data:`MAX_LABEL_CHARS` are cut.

    Raises :class:`WireError` for a frame the decoder would refuse (a count over
    2**32 - 1 in one frame, a non-finite sum, an engine outside :func:`check_engine`)
    or one over :data:`MAX_FRAME_BYTES` (use :func:`split`).
    """
    engine = check_engine(frame.engine).encode()
    try:
        calls, kc = _layers(frame)
        mask = KC_LAYERS_BIT if kc else 0
        for name in frame.histograms:
            if name not in PLAIN_HISTOGRAMS:
                raise WireError(f"unknown histogram {excerpt(name)}")
            mask |= 1 << PLAIN_HISTOGRAMS.index(name)
        topn = sorted(frame.topn_mass.items())  # ascending N: the decoder checks it
        lay = layout(len(calls), mask, len(topn))
        hists = [frame.histograms[name] for name, _, _ in lay.hists[: lay.plain]]
        numbers = _numbers(frame, calls, kc, lay, hists + [h for _, h in topn])
        process, instance, names = clip(frame.process), clip(frame.instance), b"\0".join(calls)
        key = b"".join(
            (
                KEY_FIXED.pack(frame.pid, len(calls), len(topn), mask, len(engine), len(process),
                               len(instance), len(names)),
                struct.pack(f">{len(topn)}I", *(n for n, _ in topn)),
                engine, process, instance, names,
            )
        )  # fmt: skip
    except (struct.error, OverflowError, TypeError) as exc:
        raise WireError(f"frame field out of range: {excerpt(str(exc))}") from None
    size = KEY_LENGTH.size + len(key) + len(numbers)
    data = b"".join((HEADER.pack(MAGIC, VERSION, size), KEY_LENGTH.pack(len(key)), key, numbers))
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(data)} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    return data


def _key(p: bytes) -> tuple[tuple[Any, ...], tuple[int, ...], str, str, str, str, int]:
    """The key of a version 4 datagram ``p``: its fixed fields, top-N keys, engine,
    process, instance, layer names (NUL-joined) and where the numbers start."""
    (length,) = KEY_LENGTH.unpack_from(p, HEADER.size)
    start = HEADER.size + KEY_LENGTH.size
    end = start + length
    fixed = KEY_FIXED.unpack_from(p, start)
    _, k, t, mask, ne, np, ni, nl = fixed
    if k > MAX_LAYERS or t > MAX_TOPN or mask >> (len(PLAIN_HISTOGRAMS) + 1):
        raise WireError(f"{k} layers, {t} top-N entries or mask {mask} out of range")
    off = start + KEY_FIXED.size
    ns = struct.unpack_from(f">{t}I", p, off)
    prev = 0
    for n in ns:
        if not prev < n <= MAX_TOPN_N:
            raise WireError(f"top-N keys {excerpt(ns)} are not ascending in 1..{MAX_TOPN_N}")
        prev = n
    off += 4 * t
    if off + ne + np + ni + nl != end or end > len(p):
        raise WireError(f"key of {length} bytes; its label lengths say otherwise")
    engine = engine_name(p[off : off + ne])
    off += ne
    process, instance = p[off : off + np].decode(), p[off + np : off + np + ni].decode()
    names = p[off + np + ni : end].decode()
    if (
        len(process) > MAX_LABEL_CHARS
        or len(instance) > MAX_LABEL_CHARS
        or "\x00" in process
        or "\x00" in instance
        or ((k or nl) and not _NAMES.fullmatch(names))
    ):
        raise WireError(f"a label is empty, has a NUL or exceeds {MAX_LABEL_CHARS} characters")
    return fixed, ns, engine, process, instance, names, end


def _decode_v4(p: bytes) -> Frame:
    (pid, k, t, mask, *_), ns, engine, process, instance, text, end = _key(p)
    lay = layout(k, mask, t)
    if end + lay.numbers.size != len(p):
        raise WireError(f"payload of {len(p)} bytes; its lengths and counts say otherwise")
    vals = lay.numbers.unpack_from(p, end)
    lanes, floats = vals[1 : 1 + lay.lanes], vals[1 + lay.lanes :]
    if not 0.0 <= floats[0] <= MAX_TS:
        raise WireError(f"ts {excerpt(floats[0])} is not in 0..{MAX_TS:g}")
    for s in floats[1:]:
        if not 0.0 <= s <= MAX_SUM:  # also false for NaN
            raise WireError(f"a histogram sum {excerpt(s)} is not finite in 0..{MAX_SUM:g}")
    names = text.split("\0") if k else []
    calls = dict(zip(names, lanes[LEADING_LANES:], strict=False))
    if len(calls) != k:
        raise WireError(f"{len(calls)} distinct layer names for {k} layer counts")
    new = Histogram.__new__
    built = []
    for name, buckets, at in lay.hists:
        h = new(Histogram)
        h.bounds, h.counts, h.sum = BUCKETS[name], list(lanes[buckets]), floats[at]
        built.append(h)
    kc = {}
    for i, buckets in enumerate(lay.kc):
        counts, s = list(lanes[buckets]), floats[1 + i]
        if s or any(counts):  # a layer without K(C) since the last frame: zeros, left out
            kc[names[i]] = Histogram(BUCKETS[KC_TOKENS], counts, s)
    return Frame(
        pid, process, vals[0], instance, floats[0], calls,
        dict(zip(ERROR_KINDS, lanes[:3], strict=True)),
        {name: h for (name, _, _), h in zip(lay.hists[: lay.plain], built, strict=False)},
        dict(zip(ns, built[lay.plain :], strict=True)),
        0, engine, kc, lanes[3], lanes[4],
    )  # fmt: skip


def decode(data: bytes) -> Frame:
    """Parse and validate one frame, version 4 (or 3, 2 and 1, JSON, from older probes).

    Raises :class:`WireError` for anything that is not a valid frame; nothing of a
    refused frame is returned, so nothing of it can reach a store.
    """
    if len(data) < HEADER.size:
        raise WireError(f"truncated frame: {len(data)} bytes, header needs {HEADER.size}")
    magic, version, length = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WireError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if version not in (VERSION, VERSION_V3, VERSION_V2, VERSION_JSON):
        raise WireError(
            f"unknown frame version {version}, this side speaks "
            f"{VERSION_JSON}, {VERSION_V2}, {VERSION_V3}, {VERSION}"
        )
    if len(data) - HEADER.size != length:
        raise WireError(
            f"truncated frame: payload {len(data) - HEADER.size} bytes, header says {length}"
        )
    if version == VERSION_JSON:
        from kcops.kernels.wire_json import decode_v1  # they import this module

        return decode_v1(data[HEADER.size :])
    if version != VERSION:
        from kcops.kernels.wire_v3 import decode_v3

        return decode_v3(data, version)
    try:
        return _decode_v4(data)
    except struct.error:
        raise WireError(f"truncated frame: payload of {length} bytes ends inside a field") from None
    except UnicodeDecodeError as exc:
        raise WireError(
            f"a label is not UTF-8: {excerpt(exc.object[exc.start : exc.end])}"
        ) from None


def split(frame: Frame) -> list[Frame]:
    """Split a frame whose encoding is too large into frames that fit.

    The first part keeps errors, histograms and the drop count; the layers (their
    calls and K(C)) are spread over the parts (at most :data:`MAX_LAYERS` each).
    ``seq`` of the parts is ``frame.seq, frame.seq + 1, ...``: the caller advances its
    sequence by ``len(result)``.
    """
    try:
        encode(frame)
        return [frame]
    except WireError:
        layers = list(dict.fromkeys([*frame.calls_by_layer, *frame.kc_by_layer]))
        if len(layers) <= 1:
            raise
    # Histograms, labels and errors take under 2 KB; each layer its name, a NUL, 4 bytes
    # of calls and, with K(C) by layer, its buckets and sum.
    budget = MAX_FRAME_BYTES - 4_000
    per_layer = 5 + (4 * (len(BUCKETS[KC_TOKENS]) + 1) + 8 if frame.kc_by_layer else 0)
    chunks: list[list[str]] = [[]]
    used = 0
    for layer in layers:
        size = len(clip(layer)) + per_layer
        if (used + size > budget or len(chunks[-1]) >= MAX_LAYERS) and chunks[-1]:
            chunks.append([])
            used = 0
        chunks[-1].append(layer)
        used += size
    parts: list[Frame] = []
    for names in chunks:
        first = not parts
        parts.append(
            Frame(
                pid=frame.pid, process=frame.process, seq=frame.seq + len(parts),
                instance=frame.instance, ts=frame.ts,
                calls_by_layer={n: frame.calls_by_layer[n] for n in names
                                if n in frame.calls_by_layer},
                errors=frame.errors if first else {},
                histograms=frame.histograms if first else {},
                topn_mass=frame.topn_mass if first else {},
                dropped_total=frame.dropped_total, engine=frame.engine,
                kc_by_layer={n: frame.kc_by_layer[n] for n in names if n in frame.kc_by_layer},
                internal_errors=frame.internal_errors if first else 0,
                dropped=frame.dropped if first else 0,
            )
        )  # fmt: skip
    return parts


def stream_socket_path(path: str) -> str:
    """The agent's stream socket beside its datagram socket ``path``: version 4 probes
    connect there; ``path`` itself stays a datagram socket for probes before version 4."""
    return path + ".stream"


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
