"""The probe's frame format: what an instrumented engine sends to the agent.

Torch-free on purpose (stdlib only): the agent's probe receiver imports this
module, and the sidecar image has no torch. docs/probe.md is the spec.

Every frame starts with the same header::

    magic b"KCPF" | version u16 (big endian) | payload length u32 | payload

There is one version, 6: a compact binary payload in two parts, a *key* (pid, the
counts that fix the frame's shape, the mass p its K(C) values are for, the top-N entries'
N, the engine, process, instance, model, tenant and layer names), which stays byte for
byte the same from one frame of a probe to the next, and the *numbers* (seq, a block of
u32 counters, a block of float64 sums). The key comes first and says its own length, so a
receiver can recognise a frame it has seen the shape of by one lookup and add its numbers
without parsing the rest. A frame is validated completely before a :class:`Frame`
is returned: finite non-negative sums, bounded counts of layers, top-N entries and
label lengths, labels of valid UTF-8, an engine name of a closed charset. What is
refused raises a :class:`WireError` whose type says why (:class:`Truncated`,
:class:`BadMagic`, :class:`BadVersion`, :class:`BadField`, :class:`TooLarge`).

Every count in a frame is a DELTA since the probe's previous frame, so the
receiver sums them. ``seq`` increases by one per frame sent or dropped, so a gap
tells the receiver how many frames it missed (``instance`` changes when the probe
restarts, and then ``seq`` starts again at 0). K(C) by layer (``kcops_kc_tokens``
per layer name) goes with every few frames (its histograms summed in between),
since one such histogram per layer makes a frame several times larger.
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar, Literal, NamedTuple

from kcops.histogram import ATTENTION_SECONDS as ATTENTION_SECONDS
from kcops.histogram import BUCKETS as BUCKETS
from kcops.histogram import CONTEXT_TOKENS as CONTEXT_TOKENS
from kcops.histogram import KC_RATIO as KC_RATIO
from kcops.histogram import KC_TOKENS as KC_TOKENS
from kcops.histogram import REQUEST_CONTEXT as REQUEST_CONTEXT
from kcops.histogram import REQUEST_EFFECTIVE as REQUEST_EFFECTIVE
from kcops.histogram import REQUEST_PRICED as REQUEST_PRICED
from kcops.histogram import TOPN_MASS as TOPN_MASS
from kcops.histogram import Histogram as Histogram
from kcops.histogram import format_le as format_le

MAGIC = b"KCPF"
# The one version. A change to the payload gets a new number rather than fields added to
# this one: the decoder checks the payload length against the counts it reads, and an agent
# that predates a version refuses its frames as BadVersion ("unknown_version"), which names
# the cause.
VERSION = 6
HEADER = struct.Struct(">4sHI")
# The largest frame (header included): the receiver reads a stream in buffers this much
# larger than its read size, and the publisher splits a frame that would be larger.
MAX_FRAME_BYTES = 60_000

# Bounds the decoder enforces (and the encoder respects).
MAX_U32 = 2**32 - 1  # a count of one frame (a delta of one flush interval)
MAX_SUM = 1e18  # a histogram sum in one frame (finite, so sums of sums stay finite)
SUM_ALLOWED = f"finite in 0..{MAX_SUM:g}"
MAX_TS = 1e11  # Unix seconds (year 5138)
MAX_LABEL_CHARS = 64  # process, instance and layer names
LABEL_ALLOWED = f"at most {MAX_LABEL_CHARS} characters, without NUL"
MAX_LAYERS = 4096  # layers in one frame (a bigger set is split over frames)
MAX_TOPN = 16  # top-N entries in one frame
MAX_TOPN_N = 1 << 20  # largest N of a top-N entry
MAX_ENGINE_CHARS = 16  # the engine tag: a short name, not free text
P_SCALE = 10_000  # p travels as a u16 of ten-thousandths: 0.9 is 9000
P_ALLOWED = f"in (0, 1], in steps of 1/{P_SCALE}"

# Engine of a probe that does not say (a bare ``kcops.kernels.install()``). The vLLM
# plugin says ``vllm``, the reference worker ``kcops``.
UNKNOWN_ENGINE = "unknown"
# Lower-case ASCII, a letter first: the agent exports it as the ``engine`` label, beside the
# ``engine`` label of its scrape adapters (vllm, sglang, tgi, triton, kcops).
_ENGINE = re.compile(f"[a-z][a-z0-9_-]{{0,{MAX_ENGINE_CHARS - 1}}}")
_ENGINE_BYTES = re.compile(_ENGINE.pattern.encode())

ERROR_KINDS: tuple[str, ...] = ("nan", "inf", "exception")

# Histograms without labels, in the order they appear in a frame (mask bits 0..6). The
# request histograms (version 5) come only from a probe that attributes K(C) to requests.
PLAIN_HISTOGRAMS: tuple[str, ...] = (
    ATTENTION_SECONDS, KC_TOKENS, KC_RATIO, CONTEXT_TOKENS,
    REQUEST_CONTEXT, REQUEST_EFFECTIVE, REQUEST_PRICED,
)  # fmt: skip
REQUEST_HISTOGRAMS: tuple[str, ...] = (REQUEST_CONTEXT, REQUEST_EFFECTIVE, REQUEST_PRICED)

# Layer label of calls whose layer index the integration cannot know.
UNKNOWN_LAYER = "unknown"


ENGINE_ALLOWED = f"1..{MAX_ENGINE_CHARS} characters of a-z, 0-9, _ or -, starting with a letter"

# What the agent counts a refused frame as (``kcops_probe_frames_total{outcome}``).
Outcome = Literal["malformed", "unknown_version"]


class WireError(ValueError):
    """Bytes that are not a valid probe frame, or a frame that cannot be encoded.

    Each subclass is one reason, a label value for the agent's counters: the receiver
    counts a refused frame by its type, never by its message."""

    reason: ClassVar[str] = "malformed"
    outcome: ClassVar[Outcome] = "malformed"


class Truncated(WireError):
    """The bytes end before the frame does (inside the header, the key or the numbers)."""

    reason = "truncated"


class BadMagic(WireError):
    """No ``KCPF`` where a frame must start: not a probe frame, or a stream out of step."""

    reason = "bad_magic"

    def __init__(self, magic: bytes) -> None:
        super().__init__(f"bad magic {magic!r}, expected {MAGIC!r}")


class BadVersion(WireError):
    """A frame of a version this side does not speak (there is one, :data:`VERSION`)."""

    reason = "bad_version"
    outcome = "unknown_version"

    def __init__(self, version: int) -> None:
        super().__init__(f"unknown frame version {version}, this side speaks {VERSION}")
        self.version = version


class TooLarge(WireError):
    """A frame over :data:`MAX_FRAME_BYTES` (the header says so, or the encoder made one)."""

    reason = "too_large"

    def __init__(self, size: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the limit of {MAX_FRAME_BYTES}")
        self.size = size


class BadField(WireError):
    """A field whose value is outside what is allowed: ``name``, ``value``, ``allowed``."""

    reason = "bad_field"

    def __init__(self, name: str, value: object, allowed: str) -> None:
        super().__init__(f"{name} {excerpt(value)} not allowed: {allowed}")
        self.name, self.value, self.allowed = name, value, allowed


def check_engine(name: object) -> str:
    """``name`` if it is a valid engine tag (1..16 of ``a-z 0-9 _ -``, a letter first);
    raises :class:`BadField` naming what is allowed otherwise."""
    if not isinstance(name, str) or not _ENGINE.fullmatch(name):
        raise BadField("engine", name, ENGINE_ALLOWED)
    return name


@lru_cache(maxsize=64)  # a few engines send all frames; a refused tag is never cached
def engine_name(raw: bytes) -> str:
    """The engine of a tag's bytes; raises :class:`BadField` unless :func:`check_engine`
    would accept it."""
    if not _ENGINE_BYTES.fullmatch(raw):
        raise BadField("engine", raw, ENGINE_ALLOWED)
    return raw.decode("ascii")


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
    engine: str = UNKNOWN_ENGINE
    # K(C) (``kcops_kc_tokens``) by layer name, the probe's own failures, and the frames
    # it dropped since its previous frame (a delta).
    kc_by_layer: dict[str, Histogram] = field(default_factory=dict)
    internal_errors: int = 0
    dropped: int = 0
    # The served model, when the probe knows it (vLLM's plugin): the ``model`` label of the
    # request histograms. Empty: not known.
    model: str = ""
    # The tenant of the request histograms (a bounded label, kcops.tenant; the probe sends
    # one frame per tenant that finished requests). Empty: not known.
    tenant: str = ""
    # The attention mass p its K(C) values (kcops_kc_tokens) are K_p of: the probe's first p.
    p: float = 0.9

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
    """A short ``repr`` of ``value`` for an error message: never a whole frame."""
    text = repr(value) if not isinstance(value, str) else repr(value[: limit + 1])
    return text if len(text) <= limit else text[:limit] + "..."


# Version 6 payload, all big endian (docs/probe.md is the spec):
#   key bytes u16 | key | numbers
#   key: pid u32 | layers u16 | top-N entries u8 | mask u8 | engine, process, instance, model,
#        tenant bytes u8 x5 | p u16 (ten-thousandths) | layer-name bytes u16 | N of each
#        top-N entry u32, ascending | engine ASCII | process UTF-8 | instance UTF-8
#        | model UTF-8 | tenant UTF-8 | layer names, UTF-8 joined by NUL
#   numbers: seq u64
#        | u32 block: errors nan, inf, exception | internal errors | dropped | one count per
#          layer | with mask bit 7, per layer the buckets of its kcops_kc_tokens | the
#          buckets of each mask histogram (bits 0-6: PLAIN_HISTOGRAMS) | those of each top-N
#        | f64 block: ts | with bit 7, per layer its K(C) sum | the sums of the mask
#          histograms | those of the top-N entries
# Counts are deltas of one flush interval: u32 is ample, and exact in a float64, so the
# decoder needs no range check on them. A histogram's count is the sum of its buckets.
KEY_FIXED = struct.Struct(">IHBBBBBBBHH")
KEY_LENGTH = struct.Struct(">H")
SEQ = struct.Struct(">Q")
KEY_LENGTH_AT = HEADER.size  # where a frame says its key's length
KEY_AT = KEY_LENGTH_AT + KEY_LENGTH.size  # where its key starts
KC_LAYERS_BIT = 1 << len(PLAIN_HISTOGRAMS)  # mask bit 7: per-layer K(C)
LEADING_LANES = 5  # nan, inf, exception, internal, dropped
_NAMES = re.compile(f"[^\\0]{{1,{MAX_LABEL_CHARS}}}(?:\\0[^\\0]{{1,{MAX_LABEL_CHARS}}})*")


class Layout(NamedTuple):
    """Where things are in the numbers of one (layers, mask, top-N entries) shape: indices
    into the u32 block (``lanes``) and into the f64 block (``floats``, ts first), and the
    blocks' byte offsets from where the numbers start."""

    numbers: struct.Struct  # seq, the u32 block, the f64 block
    lanes: int
    floats: int
    kc: tuple[slice, ...]  # each layer's kcops_kc_tokens buckets (mask bit 7), else ()
    hists: tuple[tuple[str, slice, int], ...]  # mask histograms, then top-N: name, buckets, sum
    plain: int  # how many of ``hists`` are mask histograms

    @property
    def u32_at(self) -> int:
        return SEQ.size

    @property
    def f64_at(self) -> int:
        return SEQ.size + 4 * self.lanes


def key_end(data: bytes, off: int = 0) -> int:
    """Where the key of the frame at ``off`` ends and its numbers start (no check: the
    caller knows ``data`` holds the frame's first :data:`KEY_AT` bytes)."""
    return off + KEY_AT + (data[off + KEY_LENGTH_AT] << 8 | data[off + KEY_LENGTH_AT + 1])


def key_layout(data: bytes, off: int = 0) -> Layout:
    """The layout of the numbers of the frame at ``off``, from the counts in its key."""
    _, layers, topn, mask = KEY_FIXED.unpack_from(data, off + KEY_AT)[:4]
    return layout(layers, mask, topn)


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
    numbers = struct.Struct(f"{SEQ.format}{lane}I{flt}d")
    return Layout(numbers, lane, flt, tuple(kc), tuple(hists), len(names) - topn)


def p_units(p: float) -> int:
    """``p`` as the frame carries it (ten-thousandths); raises :class:`BadField` outside
    (0, 1]."""
    ok = isinstance(p, int | float) and math.isfinite(p)
    units = round(p * P_SCALE) if ok else 0
    if not 1 <= units <= P_SCALE:
        raise BadField("p", p, P_ALLOWED)
    return units


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
    if len(calls) > MAX_LAYERS:
        raise BadField("layers", len(calls), f"0..{MAX_LAYERS} in one frame (split it)")
    if len(frame.topn_mass) > MAX_TOPN:
        raise BadField("top-N entries", len(frame.topn_mass), f"0..{MAX_TOPN}")
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
    for s in floats[1:]:
        if not 0.0 <= s <= MAX_SUM:  # also false for NaN
            raise BadField("histogram sum", s, SUM_ALLOWED)
    return lay.numbers.pack(frame.seq, *lanes, *floats)


def encode(frame: Frame) -> bytes:
    """Serialise one frame (version 6). Labels longer than :data:`MAX_LABEL_CHARS` are cut.

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
                raise BadField("histogram", name, ", ".join(PLAIN_HISTOGRAMS))
            mask |= 1 << PLAIN_HISTOGRAMS.index(name)
        topn = sorted(frame.topn_mass.items())  # ascending N: the decoder checks it
        lay = layout(len(calls), mask, len(topn))
        hists = [frame.histograms[name] for name, _, _ in lay.hists[: lay.plain]]
        numbers = _numbers(frame, calls, kc, lay, hists + [h for _, h in topn])
        process, instance, names = clip(frame.process), clip(frame.instance), b"\0".join(calls)
        model, tenant = clip(frame.model), clip(frame.tenant)
        key = b"".join(
            (
                KEY_FIXED.pack(frame.pid, len(calls), len(topn), mask, len(engine), len(process),
                               len(instance), len(model), len(tenant), p_units(frame.p),
                               len(names)),
                struct.pack(f">{len(topn)}I", *(n for n, _ in topn)),
                engine, process, instance, model, tenant, names,
            )
        )  # fmt: skip
    except (struct.error, OverflowError, TypeError) as exc:
        raise BadField("frame field", str(exc), "within its width (a count: u32)") from None
    size = KEY_LENGTH.size + len(key) + len(numbers)
    data = b"".join((HEADER.pack(MAGIC, VERSION, size), KEY_LENGTH.pack(len(key)), key, numbers))
    if len(data) > MAX_FRAME_BYTES:
        raise TooLarge(len(data))
    return data


class Key(NamedTuple):
    """The key of a frame: its shape, its labels, and where its numbers start."""

    pid: int
    layers: int
    topn: int
    mask: int
    ns: tuple[int, ...]  # the top-N entries' N, ascending
    engine: str
    process: str
    instance: str
    model: str
    tenant: str
    p: float
    names: str  # layer names, joined by NUL
    end: int  # where the numbers start


def _key(p: bytes) -> Key:
    """The key of the frame ``p`` (its header checked)."""
    (length,) = KEY_LENGTH.unpack_from(p, HEADER.size)
    start = HEADER.size + KEY_LENGTH.size
    end = start + length
    pid, k, t, mask, ne, np, ni, nm, nt, pu, nl = KEY_FIXED.unpack_from(p, start)
    if not 1 <= pu <= P_SCALE:
        raise BadField("p", pu / P_SCALE, P_ALLOWED)
    if k > MAX_LAYERS:
        raise BadField("layers", k, f"0..{MAX_LAYERS}")
    if t > MAX_TOPN:
        raise BadField("top-N entries", t, f"0..{MAX_TOPN}")
    if mask >> (len(PLAIN_HISTOGRAMS) + 1):
        raise BadField("histogram mask", mask, f"bits 0..{len(PLAIN_HISTOGRAMS)}")
    off = start + KEY_FIXED.size
    ns: tuple[int, ...] = struct.unpack_from(f">{t}I", p, off)
    prev = 0
    for n in ns:
        if not prev < n <= MAX_TOPN_N:
            raise BadField("top-N keys", ns, f"ascending in 1..{MAX_TOPN_N}")
        prev = n
    off += 4 * t
    if off + ne + np + ni + nm + nt + nl != end or end > len(p):
        raise BadField("key length", length, "the sum of the key's label lengths")
    engine = engine_name(p[off : off + ne])
    off += ne
    process, instance = p[off : off + np].decode(), p[off + np : off + np + ni].decode()
    off += np + ni
    model, tenant = p[off : off + nm].decode(), p[off + nm : off + nm + nt].decode()
    names = p[off + nm + nt : end].decode()
    for label in (process, instance, model, tenant):
        if len(label) > MAX_LABEL_CHARS or "\x00" in label:
            raise BadField("label", label, LABEL_ALLOWED)
    if (k or nl) and not _NAMES.fullmatch(names):
        raise BadField("layer names", names, f"{k} names of 1..{MAX_LABEL_CHARS} characters")
    return Key(pid, k, t, mask, ns, engine, process, instance, model, tenant, pu / P_SCALE,
               names, end)  # fmt: skip


def _decode(p: bytes) -> Frame:
    key = _key(p)
    k, end = key.layers, key.end
    lay = layout(k, key.mask, key.topn)
    if end + lay.numbers.size != len(p):
        raise BadField("payload length", len(p) - HEADER.size, "what its key's counts say")
    vals = lay.numbers.unpack_from(p, end)
    seq: int = vals[0]
    lanes: tuple[int, ...] = vals[1 : 1 + lay.lanes]
    floats: tuple[float, ...] = vals[1 + lay.lanes :]
    if not 0.0 <= floats[0] <= MAX_TS:
        raise BadField("ts", floats[0], f"0..{MAX_TS:g} (Unix seconds)")
    for s in floats[1:]:
        if not 0.0 <= s <= MAX_SUM:  # also false for NaN
            raise BadField("histogram sum", s, SUM_ALLOWED)
    names = key.names.split("\0") if k else []
    calls = dict(zip(names, lanes[LEADING_LANES:], strict=False))
    if len(calls) != k:
        raise BadField("distinct layer names", len(calls), f"{k}, one per layer count")
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
        key.pid, key.process, seq, key.instance, floats[0], calls,
        dict(zip(ERROR_KINDS, lanes[:3], strict=True)),
        {name: h for (name, _, _), h in zip(lay.hists[: lay.plain], built, strict=False)},
        dict(zip(key.ns, built[lay.plain :], strict=True)),
        key.engine, kc, lanes[3], lanes[4], key.model, key.tenant, key.p,
    )  # fmt: skip


def header(data: bytes, off: int = 0) -> tuple[int, int]:
    """``(version, payload length)`` of the frame header at ``off``: raises
    :class:`Truncated` if ``data`` ends first, :class:`BadMagic` or :class:`TooLarge`
    (a stream with either is out of step for good). The version is not checked here."""
    if len(data) - off < HEADER.size:
        raise Truncated(f"truncated frame: {len(data) - off} bytes, the header needs {HEADER.size}")
    magic, version, length = HEADER.unpack_from(data, off)
    if magic != MAGIC:
        raise BadMagic(magic)
    if length > MAX_FRAME_BYTES - HEADER.size:
        raise TooLarge(HEADER.size + length)
    return version, length


def decode(data: bytes) -> Frame:
    """Parse and validate one frame.

    Raises a :class:`WireError` for anything that is not a valid frame, of a type that
    says why; nothing of a refused frame is returned, so nothing of it can reach a store.
    """
    version, length = header(data)
    if version != VERSION:
        raise BadVersion(version)
    if len(data) - HEADER.size < length:
        raise Truncated(
            f"truncated frame: payload {len(data) - HEADER.size} bytes, header says {length}"
        )
    if len(data) - HEADER.size > length:
        raise BadField("payload length", len(data) - HEADER.size, f"{length}, as the header says")
    try:
        return _decode(data)
    except struct.error:
        raise Truncated(f"truncated frame: payload of {length} bytes ends inside a field") from None
    except UnicodeDecodeError as exc:
        raise BadField("label", exc.object[exc.start : exc.end], "UTF-8") from None


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
                engine=frame.engine,
                kc_by_layer={n: frame.kc_by_layer[n] for n in names if n in frame.kc_by_layer},
                internal_errors=frame.internal_errors if first else 0,
                dropped=frame.dropped if first else 0,
                model=frame.model,
                tenant=frame.tenant,
                p=frame.p,
            )
        )  # fmt: skip
    return parts


def default_socket_path() -> str:
    """The agent's stream socket: where it listens and the probe connects.

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
