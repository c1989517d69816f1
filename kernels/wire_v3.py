"""Versions 2 and 3 of the probe frame: read for one release, sent by probes before 4.

Version 3 is an engine tag (a length byte and the name) followed by a version 2
payload; version 2 has no tag (engine ``unknown``). :func:`encode_v3` exists for
tests, for the side-by-side benchmark and for the agent's datagram socket, which
older probes still send to. Stdlib only, like :mod:`wire`. docs/probe.md is the spec.

Version 2 payload, all big endian:
  fixed: pid u32 | seq u64 | ts f64 | dropped_total u32 | errors nan, inf, exception u32 x3
         | layers u16 | top-N entries u8 | histogram mask u8 (bit i: PLAIN_HISTOGRAMS[i])
         | process bytes u8 | instance bytes u8 | layer-name bytes u16
  | process UTF-8 | instance UTF-8 | layer names, UTF-8 joined by NUL
  | u32 block: layer counts, then the buckets of each mask histogram, then per top-N
    entry its N and its buckets | f64 block: the sums (mask histograms, then top-N)
Counts are deltas of one flush interval; ``dropped_total`` is cumulative.
"""

from __future__ import annotations

import operator
import re
import struct
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

from kcops.kernels import wire
from kcops.kernels.wire import (
    BUCKETS,
    ERROR_KINDS,
    HEADER,
    MAGIC,
    MAX_FRAME_BYTES,
    MAX_LABEL_CHARS,
    MAX_LAYERS,
    MAX_SUM,
    MAX_TOPN,
    MAX_TOPN_N,
    MAX_TS,
    MAX_U32,
    PLAIN_HISTOGRAMS,
    TOPN_MASS,
    UNKNOWN_ENGINE,
    UNKNOWN_LAYER,
    Frame,
    Histogram,
    WireError,
    clip,
    excerpt,
)

VERSION_V3 = 3
VERSION_V2 = 2
FIXED = struct.Struct(">IQdI3IHBBBBH")
# Layer names: 1..MAX_LABEL_CHARS characters each, separated by one NUL.
_NAMES = re.compile(f"[^\\0]{{1,{MAX_LABEL_CHARS}}}(?:\\0[^\\0]{{1,{MAX_LABEL_CHARS}}})*")


class Layout(NamedTuple):
    """Where things are in the number blocks of one (layers, mask, top-N entries) shape."""

    numbers: struct.Struct
    slots: tuple[tuple[str, tuple[float, ...], slice], ...]  # name, bounds, buckets
    plain: tuple[str, ...]  # the mask's histograms, in order
    topn_keys: Callable[[tuple[Any, ...]], Any] | None  # the top-N entries' N from the values


@lru_cache(maxsize=1024)
def layout(layers: int, mask: int, topn: int) -> Layout:
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
    return Layout(struct.Struct(f">{i}I{len(slots)}d"), tuple(slots), plain, get)


def _payload(frame: Frame) -> bytes:
    calls: dict[bytes, int] = {}
    for layer, n in frame.calls_by_layer.items():
        key = clip(layer) or UNKNOWN_LAYER.encode()
        calls[key] = calls.get(key, 0) + n
    if len(calls) > MAX_LAYERS or len(frame.topn_mass) > MAX_TOPN:
        raise WireError(f"frame has more than {MAX_LAYERS} layers or {MAX_TOPN} top-N entries")
    mask = 0
    for name in frame.histograms:
        if name not in PLAIN_HISTOGRAMS:
            raise WireError(f"unknown histogram {excerpt(name)}")
        mask |= 1 << PLAIN_HISTOGRAMS.index(name)
    lay = layout(len(calls), mask, len(frame.topn_mass))
    hists = [frame.histograms[name] for name in lay.plain]
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
    process, instance, layer_names = clip(frame.process), clip(frame.instance), b"\0".join(calls)
    return b"".join(
        (
            FIXED.pack(frame.pid, frame.seq, frame.ts, min(frame.dropped_total, MAX_U32),
                       *(frame.errors.get(k, 0) for k in ERROR_KINDS), len(calls),
                       len(frame.topn_mass), mask, len(process), len(instance), len(layer_names)),
            process, instance, layer_names,
            lay.numbers.pack(*u32, *(h.sum for h in hists)),
        )
    )  # fmt: skip


def encode_v3(frame: Frame, *, tagged: bool = True) -> bytes:
    """The version 3 datagram of ``frame`` (``tagged=False``: version 2, no engine tag), as
    probes before version 4 sent it; a frame's per-layer K(C) and internal errors have no
    place in it and are left out. Raises :class:`WireError` like :func:`wire.encode`."""
    engine = wire.check_engine(frame.engine).encode()
    try:
        payload = _payload(frame)
    except (struct.error, OverflowError, TypeError) as exc:
        raise WireError(f"frame field out of range: {excerpt(str(exc))}") from None
    if tagged:
        payload = bytes((len(engine),)) + engine + payload
    data = HEADER.pack(MAGIC, VERSION_V3 if tagged else VERSION_V2, len(payload)) + payload
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(data)} bytes exceeds the limit of {MAX_FRAME_BYTES}")
    return data


def _histograms(
    vals: tuple[Any, ...], lay: Layout
) -> tuple[dict[str, Histogram], dict[int, Histogram]]:
    """Histograms from the number blocks; the sums must be finite and non-negative."""
    slots = lay.slots
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
    plain = len(lay.plain)
    hists = dict(zip(lay.plain, out, strict=False))
    if lay.topn_keys is None:
        return hists, {}
    ns = lay.topn_keys(vals)
    if len(lay.slots) - plain == 1:
        ns = (ns,)
    prev = 0
    for n in ns:
        if not prev < n <= MAX_TOPN_N:
            raise WireError(f"top-N keys {excerpt(ns)} are not ascending in 1..{MAX_TOPN_N}")
        prev = n
    return hists, dict(zip(ns, out[plain:], strict=True))


def _engine_tag(p: bytes) -> tuple[int, str]:
    """The engine tag of a version 3 datagram ``p``: (offset of its v2 body, engine)."""
    if len(p) <= HEADER.size:
        raise WireError("truncated frame: an empty payload has no engine tag")
    end = HEADER.size + 1 + p[HEADER.size]
    if end > len(p):
        raise WireError(f"truncated frame: the engine tag ends past the payload, at {end}")
    return end, wire.engine_name(p[HEADER.size + 1 : end])


def _decode_v2(p: bytes, start: int, engine: str) -> Frame:
    """``p`` is the whole datagram; the version 2 body starts at ``start``."""
    pid, seq, ts, dropped, e0, e1, e2, k, t, mask, np, ni, nl = FIXED.unpack_from(p, start)
    if not 0.0 <= ts <= MAX_TS or k > MAX_LAYERS or t > MAX_TOPN or mask >> len(PLAIN_HISTOGRAMS):
        raise WireError(f"ts {excerpt(ts)}, {k} layers, {t} top-N or mask {mask} out of range")
    off = start + FIXED.size
    process = p[off : off + np].decode()
    instance = p[off + np : off + np + ni].decode()
    text = p[off + np + ni : off + np + ni + nl].decode()
    off += np + ni + nl
    lay = layout(k, mask, t)
    if off + lay.numbers.size != len(p):
        raise WireError(f"payload of {len(p)} bytes; its lengths and counts say otherwise")
    if (
        len(process) > MAX_LABEL_CHARS
        or len(instance) > MAX_LABEL_CHARS
        or "\x00" in process  # as version 1 refuses it, and the encoder drops it
        or "\x00" in instance
        or ((k or nl) and not _NAMES.fullmatch(text))
    ):
        raise WireError(f"a label is empty, has a NUL or exceeds {MAX_LABEL_CHARS} characters")
    names = text.split("\0") if k else []
    vals = lay.numbers.unpack_from(p, off)
    calls = dict(zip(names, vals, strict=False))
    if len(calls) != k:
        raise WireError(f"{len(calls)} distinct layer names for {k} layer counts")
    hists, topn = _histograms(vals, lay)
    errors = {"nan": e0, "inf": e1, "exception": e2}
    return Frame(pid, process, seq, instance, ts, calls, errors, hists, topn, dropped, engine)


def decode_v3(data: bytes, version: int) -> Frame:
    """Parse and validate a version 3 or 2 datagram whose header :func:`wire.decode` checked.

    Raises only :class:`WireError`."""
    try:
        if version == VERSION_V2:
            return _decode_v2(data, HEADER.size, UNKNOWN_ENGINE)
        return _decode_v2(data, *_engine_tag(data))
    except struct.error:
        raise WireError(
            f"truncated frame: payload of {len(data) - HEADER.size} bytes ends inside a field"
        ) from None
    except UnicodeDecodeError as exc:
        raise WireError(
            f"a label is not UTF-8: {excerpt(exc.object[exc.start : exc.end])}"
        ) from None
