"""Summing probe frames in bulk: how the agent reads thousands a second.

Every offset comes from the wire module (:func:`kcops.kernels.wire.key_end`,
:class:`~kcops.kernels.wire.Layout`): this is a faster reader of the one format, not a
second definition of it.

A frame opens with its key (``wire``: header, key length, then pid, the
counts that fix its shape, the top-N keys, engine, process, instance and layer
names), which a probe repeats byte for byte in every frame; the numbers follow. So
the first frame of each key goes through ``wire.decode``, which checks everything,
and its :class:`Shape` is cached under the key's exact bytes; for every later frame
with those bytes the receiver does one dict lookup and one length check, adds its
u32 block into two big integers, and keeps where the frame starts:

the u32 block read as one big integer holds each counter in a 32-bit lane. ``a`` sums
those integers as they are and ``b`` sums them with every other lane masked off, so
``b`` holds the even lanes' sums with 32 bits of headroom each, and ``a - b`` the odd
lanes' (shifted up 32 bits): 2**32 frames fit before a lane could carry into the next
(:data:`FOLD_AFTER_FRAMES` is far below that). Every u32 is a valid count, so nothing
in that block needs a check.

What does need checks is the f64 block (ts, sums): at the end of each buffer the
blocks of a shape's frames are joined and checked together, by their top bytes: a
float64 whose first byte is below 0x43 is a non-negative finite number under 2**49,
inside what ``wire.decode`` allows (sums up to 1e18); ts needs a first byte below 0x42
(under 2**33 s, the year 2242). Then each column is summed at C speed. A batch with any
value outside those ranges (NaN, negative, huge, or just a sum over 2**49) is not
guessed at: each of its frames goes through ``wire.decode`` instead, which refuses
the bad ones precisely and sums the rest.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable
from functools import lru_cache

from kcops.kernels import wire

KEY_AT = wire.KEY_AT  # where a frame's key starts
KEY_LENGTH_AT = wire.KEY_LENGTH_AT
MAX_CACHED_KEY_BYTES = 1 << 20  # all cached shape keys together
FOLD_AFTER_FRAMES = 1 << 24  # far below the 2**32 frames a lane pair holds
SUM_TOP_OK = bytes(range(0x43))  # first bytes of a float64 in [+0, 2**49)
TS_TOP_OK = bytes(range(0x42))  # [+0, 2**33)
_SWAP = sys.byteorder == "little"


@lru_cache(maxsize=64)
def lane_mask(lanes: int) -> int:
    """Ones in the even 32-bit lanes (counting from the least significant) of ``lanes``."""
    return sum(0xFFFFFFFF << (64 * m) for m in range((lanes + 1) // 2))


def lanes_of(a: int, b: int, lanes: int) -> list[int]:
    """The per-lane sums from the two accumulators (see the module docstring), in the
    block's order (first lane first)."""
    words = (lanes + 1) // 2
    odd = (a - b) >> 32
    fmt = f">{words}Q"
    even_w = struct.unpack(fmt, b.to_bytes(8 * words, "big"))
    odd_w = struct.unpack(fmt, odd.to_bytes(8 * words, "big"))
    lsb_first: list[int] = []
    for m in range(words - 1, -1, -1):  # word 0 (least significant) is last
        lsb_first += (even_w[m], odd_w[m])
    return lsb_first[:lanes][::-1]


class Shape:
    """What every frame with one exact key has in common, and its frames in the buffer
    being read (``a``, ``b``, ``offs``: reset when the buffer is committed)."""

    __slots__ = (
        "a",
        "b",
        "f64_at",
        "floats",
        "key",
        "label",
        "layout",
        "mask",
        "model",
        "names",
        "ns",
        "offs",
        "p",
        "size",
        "tenant",
        "u32_at",
    )  # fmt: skip

    def __init__(self, frame: wire.Frame, key: bytes) -> None:
        lay = wire.key_layout(key)
        key_end = len(key)
        self.key = key
        self.layout = lay
        # (engine, process): the decoder kept both within their limits
        self.label = (frame.engine, frame.process or "unknown")
        self.model = frame.model  # the request histograms' labels
        self.tenant = frame.tenant
        self.p = frame.p  # the mass its K(C) values are K_p of
        self.names: tuple[str, ...] = tuple(frame.calls_by_layer)  # the frame's order
        self.ns: tuple[int, ...] = tuple(frame.topn_mass)  # ascending, as sent
        self.u32_at = key_end + lay.u32_at
        self.f64_at = key_end + lay.f64_at
        self.floats = lay.floats
        self.size = key_end + lay.numbers.size
        self.mask = lane_mask(lay.lanes)
        self.a = self.b = 0
        self.offs: list[int] = []


class Pending:
    """Frames of one shape summed for one process since its last fold."""

    __slots__ = ("a", "b", "frames", "shape", "sums")

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.a = self.b = 0
        self.sums = [0.0] * (shape.floats - 1)  # ts is checked, not summed
        self.frames = 0

    def counters(self) -> list[int]:
        return lanes_of(self.a, self.b, self.shape.layout.lanes)


def scan(data: bytes, off: int, get: Callable[[bytes], Shape | None],
         touched: list[Shape], limit: int) -> tuple[int, int]:  # fmt: skip
    """Take every frame from ``off`` on whose key is cached, up to ``limit`` frames; stops
    at anything else (another version, an unknown key, a partial frame). Returns (where
    it stopped, frames taken).

    A connection sends runs of frames of one shape, so after one lookup the frames that
    follow are matched against that shape's key in place (``startswith``, no slice)."""
    end = len(data)
    n = 0
    fb = int.from_bytes
    ka, kl = KEY_AT, KEY_LENGTH_AT  # locals: this loop runs per frame
    while n < limit and end - off >= ka:
        kend = off + ka + (data[off + kl] << 8 | data[off + kl + 1])
        if kend > end:
            break
        shape = get(data[off:kend])
        if shape is None:
            break
        key, size, ua, fa, mask = shape.key, shape.size, shape.u32_at, shape.f64_at, shape.mask
        offs = shape.offs
        if not offs:
            touched.append(shape)
        a = b = 0
        first = n
        while n < limit and off + size <= end and data.startswith(key, off):
            v = fb(data[off + ua : off + fa], "big")
            a += v
            b += v & mask
            offs.append(off)
            off += size
            n += 1
        shape.a += a
        shape.b += b
        if n == first:  # a partial frame of a known shape: the rest comes with the next read
            if not offs:
                touched.remove(shape)
            break
    return off, n


def column_sums_of(data: bytes, shape: Shape, offs: list[int]) -> list[float] | None:
    """The f64 blocks of ``shape``'s frames at ``offs`` in ``data``, checked together and
    summed by column (ts left out); None if any value is outside what the bulk check
    vouches for."""
    fa, fe = shape.f64_at, shape.size
    raw = b"".join([data[o + fa : o + fe] for o in offs])
    floats = shape.floats
    if raw[0::8].translate(None, SUM_TOP_OK) or raw[0 :: 8 * floats].translate(None, TS_TOP_OK):
        return None
    values = array("d", raw)
    if _SWAP:
        values.byteswap()
    return [sum(values[j::floats]) for j in range(1, floats)]


class ShapeCache:
    """Shapes by their exact key bytes, bounded in count and in the bytes of their keys
    (a burst of many distinct processes must not leave thousands behind)."""

    def __init__(self, max_shapes: int = 256) -> None:
        self.max_shapes = max_shapes
        self._shapes: dict[bytes, Shape] = {}
        self._key_bytes = 0
        self.get = self._shapes.get

    def learn(self, data: bytes, frame: wire.Frame) -> None:
        """Cache the shape of ``data``, a frame ``wire.decode`` just returned as ``frame``."""
        key = data[: wire.key_end(data)]
        if key in self._shapes:
            return
        if (
            self._key_bytes + len(key) > MAX_CACHED_KEY_BYTES
            or len(self._shapes) >= self.max_shapes
        ):
            self._shapes.clear()  # a flood of distinct shapes: start over, stay bounded
            self._key_bytes = 0
        self._shapes[key] = Shape(frame, key)
        self._key_bytes += len(key)

    def __len__(self) -> int:
        return len(self._shapes)
