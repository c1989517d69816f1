"""Summing version-3 (and version-2) probe frames without building a Frame for each one.

Probes before version 4 send these over the agent's datagram socket; version 4 frames
take :mod:`probe_bulk`.

At 10,000 frames a second the receiver cannot afford what ``wire.decode``
does per frame (a dict of layers, seven Histogram objects, a regex over the
layer names) followed by per-bucket Python additions: that was ~50 µs a frame.
A probe sends the same labels in every frame, so the part of a frame that
needs the costly checks (its shape: layer, histogram and top-N counts, and the
process, instance and layer names) is checked once by ``wire.decode`` and
cached under its exact bytes. Every later frame with those bytes gets the
per-frame checks ``wire.decode`` would make (header length, timestamp range,
total length, finite sums in range, ascending top-N keys) and its counters are
added in one step:

the u32 block of a frame, read as one big integer, holds each counter in a
32-bit lane. Masking every other lane leaves 32 zero bits above each kept lane,
so adding such integers sums all those lanes at once with room for 2**32
frames before a lane could carry into the next (``PendingSums`` is folded long
before that). Two integers (even and odd lanes) carry the whole block.

A version-3 frame is a version-2 body behind the sender's engine tag (a length
byte and the name); the tag bytes are part of the cache key, so a shape also
stands for one engine, checked by ``wire.decode`` when it was learned. Keys
start with the frame's version bytes: a shape learned from one version never
vouches for a frame of another.

The fast path reads the version-2 body through ``wire_v3``'s own structs; if
that layout changes (``FIXED_FORMAT`` no longer matches, or versions move on),
:func:`enabled` is False and every frame takes ``wire.decode``: slower, never
wrong. A unit test fails in that case so the fast path gets updated.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from operator import add

from kcops.kernels import wire, wire_v3

# The version-2 fixed part this module was written for (see wire_v3.FIXED):
# pid, seq, ts, dropped_total, errors x3 | layers, top-N entries, mask, lengths x3.
FIXED_FORMAT = ">IQdI3IHBBBBH"
FIXED = wire_v3.FIXED
HEADER_SIZE = wire.HEADER.size
V2_PREFIX = wire.MAGIC + wire_v3.VERSION_V2.to_bytes(2, "big")
V3_PREFIX = wire.MAGIC + wire_v3.VERSION_V3.to_bytes(2, "big")
# The shape fields (layers .. layer-name bytes) are the last 8 bytes of the fixed part:
# the cache key runs from there to the end of the names (for version 2; a version-3
# body sits after the engine tag, so everything moves by the tag's length).
SHAPE_START = HEADER_SIZE + FIXED.size - 8
LABELS_START = HEADER_SIZE + FIXED.size
MAX_CACHED_KEY_BYTES = 1 << 20  # all cached shape keys together
FOLD_AFTER_FRAMES = 1 << 24  # far below the 2**32 frames a 64-bit lane pair holds


def enabled() -> bool:
    """True when ``wire_v3``'s versions and body layout are the ones this module reads."""
    return wire_v3.VERSION_V3 == 3 and wire_v3.VERSION_V2 == 2 and FIXED.format == FIXED_FORMAT


@lru_cache(maxsize=256)
def _structs(k: int, mask: int, t: int) -> tuple[struct.Struct, struct.Struct | None]:
    """The histogram sums, and the top-N entries' N (only those u32s), of one layout."""
    layout = wire_v3.layout(k, mask, t)
    plain = len(layout.plain)
    fmt, at = ">", 0
    for _, _, buckets in layout.slots[plain:]:  # each N sits just before its buckets
        fmt += f"{4 * (buckets.start - 1 - at)}xI"
        at = buckets.start
    return struct.Struct(f">{len(layout.slots)}d"), struct.Struct(fmt) if t else None


@lru_cache(maxsize=64)
def _lane_mask(lanes: int) -> int:
    """Ones in the even 32-bit lanes (counting from the least significant) of ``lanes``."""
    return sum(0xFFFFFFFF << (64 * m) for m in range((lanes + 1) // 2))


class Shape:
    """What every frame with one exact set of shape and label bytes has in common."""

    __slots__ = (
        "instance",
        "keys",
        "label",
        "lanes",
        "mask",
        "names",
        "plain",
        "process",
        "size",
        "slots",
        "sums",
        "sums_at",
        "u32_at",
    )

    def __init__(self, frame: wire.Frame, u32_at: int, k: int, mask: int, t: int) -> None:
        layout = wire_v3.layout(k, mask, t)
        self.process = frame.process
        # (engine, process): the decoder keeps both within their limits
        self.label = (frame.engine, frame.process or "unknown")
        self.instance = frame.instance
        self.names: tuple[str, ...] = tuple(frame.calls_by_layer)  # in the frame's order
        self.slots = layout.slots
        self.plain = len(layout.plain)
        self.lanes = (layout.numbers.size - 8 * len(layout.slots)) // 4
        self.mask = _lane_mask(self.lanes)
        self.u32_at = u32_at  # where the counters start: right after the names
        self.sums_at = self.u32_at + 4 * self.lanes
        self.size = self.u32_at + layout.numbers.size
        self.sums, self.keys = _structs(k, mask, t)  # shared by shapes of one layout


class PendingSums:
    """Frames of one shape (and one set of top-N keys) summed since the last fold."""

    __slots__ = ("even", "frames", "ns", "odd", "shape", "sums")

    def __init__(self, shape: Shape, ns: tuple[int, ...]) -> None:
        self.shape = shape
        self.ns = ns
        self.even = 0
        self.odd = 0
        self.sums: list[float] = [0.0] * len(shape.slots)
        self.frames = 0

    def add(self, block: int, sums: tuple[float, ...]) -> None:
        mask = self.shape.mask
        self.even += block & mask
        self.odd += (block >> 32) & mask
        self.sums = list(map(add, self.sums, sums))
        self.frames += 1

    def counters(self) -> list[int]:
        """The summed u32 fields, in the frame's order."""
        words = (self.shape.lanes + 1) // 2
        fmt = f">{words}Q"
        even = struct.unpack(fmt, self.even.to_bytes(8 * words, "big"))
        odd = struct.unpack(fmt, self.odd.to_bytes(8 * words, "big"))
        lsb_first: list[int] = []
        for m in range(words - 1, -1, -1):  # word 0 (least significant) is last
            lsb_first += (even[m], odd[m])
        return lsb_first[: self.shape.lanes][::-1]


class ShapeCache:
    """Shapes by their exact bytes, bounded in count and in the bytes of their keys.

    A probe sends one shape (a few when it splits frames), so ``max_shapes`` of a few
    per process is plenty; a burst of many distinct processes must not leave
    thousands of shapes (a few KB each) behind once they are gone.
    """

    def __init__(self, max_shapes: int = 256) -> None:
        self.max_shapes = max_shapes
        self._shapes: dict[bytes, Shape] = {}
        self._key_bytes = 0

    def get(self, key: bytes) -> Shape | None:
        return self._shapes.get(key)

    def learn(self, data: bytes, key: bytes, u32_at: int, k: int, mask: int, t: int) -> Shape:
        """The shape of ``data``, checked completely by ``wire.decode`` (which raises)."""
        shape = Shape(wire.decode(data), u32_at, k, mask, t)
        if (
            self._key_bytes + len(key) > MAX_CACHED_KEY_BYTES
            or len(self._shapes) >= self.max_shapes
        ):
            self._shapes.clear()  # a flood of distinct shapes: start over, stay bounded
            self._key_bytes = 0
        self._shapes[key] = shape
        self._key_bytes += len(key)
        return shape

    def __len__(self) -> int:
        return len(self._shapes)


def sums_ok(sums: tuple[float, ...]) -> bool:
    """Each histogram sum finite in 0..MAX_SUM, as ``wire.decode`` requires."""
    top = wire.MAX_SUM
    for s in sums:  # noqa: SIM110 - a loop: all() over a generator costs 2x, per frame
        if not 0.0 <= s <= top:  # also false for NaN
            return False
    return True


def keys_ok(ns: tuple[int, ...]) -> bool:
    """Top-N keys ascending in 1..MAX_TOPN_N, as ``wire.decode`` requires."""
    prev = 0
    for n in ns:
        if not prev < n <= wire.MAX_TOPN_N:
            return False
        prev = n
    return True
