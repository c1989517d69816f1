"""The probe frame format: round trip, typed errors, bounds, fixed buckets, socket path.

Version 4 is what probes send; versions 3, 2 (``wire_v3``) and 1 (JSON) are still read."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcops.kernels import wire
from kcops.kernels.wire_json import encode_v1
from kcops.kernels.wire_v3 import encode_v3


def sample_frame() -> wire.Frame:
    """A frame every version can carry (no K(C) by layer, no internal errors)."""
    hist = {name: wire.Histogram.of(name) for name in wire.PLAIN_HISTOGRAMS}
    hist[wire.ATTENTION_SECONDS].observe(0.003)
    hist[wire.KC_TOKENS].observe(40)
    hist[wire.KC_RATIO].observe(0.2)
    hist[wire.CONTEXT_TOKENS].observe(512)
    topn = {n: wire.Histogram.of(wire.TOPN_MASS) for n in (16, 32, 64)}
    topn[16].observe(0.7)
    return wire.Frame(
        pid=123,
        process="python3",
        seq=7,
        instance="abc",
        ts=1700000000.5,
        calls_by_layer={"0": 3, "1": 3, wire.UNKNOWN_LAYER: 1},
        errors={"nan": 1, "inf": 0, "exception": 2},
        histograms=hist,
        topn_mass=topn,
        dropped_total=4,
        engine="vllm",
    )


def sample_v4() -> wire.Frame:
    """What a version 4 probe sends: K(C) by layer, its internal errors, drops as a delta."""
    f = sample_frame()
    del f.histograms[wire.KC_TOKENS]
    kc = {"0": wire.Histogram.of(wire.KC_TOKENS), "1": wire.Histogram.of(wire.KC_TOKENS)}
    kc["0"].observe(40)
    kc["0"].observe(200)
    kc["1"].observe(3)
    return dataclasses.replace(f, dropped_total=0, kc_by_layer=kc, internal_errors=5, dropped=4)


def as_v2(data: bytes) -> bytes:
    """A version 3 datagram as the version 2 datagram of an older probe (no engine tag)."""
    body = data[11 + data[10] :]
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION_V2, len(body)) + body


def with_tag(data: bytes, tag: bytes, length: int | None = None) -> bytes:
    """``data`` (version 3) with its engine tag replaced by ``tag`` (and length byte)."""
    body = data[11 + data[10] :]
    payload = bytes((len(tag) if length is None else length,)) + tag + body
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION_V3, len(payload)) + payload


def test_round_trip() -> None:
    frame = sample_v4()
    data = wire.encode(frame)
    assert data[:6] == wire.MAGIC + b"\x00\x04"
    assert wire.decode(data) == frame


def test_version_3_frames_still_decode() -> None:
    frame = sample_frame()
    assert wire.decode(encode_v3(frame)) == frame


def test_version_1_json_frames_still_decode() -> None:
    frame = sample_frame()
    data = encode_v1(frame)
    assert struct.unpack(">4sHI", data[:10]) == (b"KCPF", 1, len(data) - 10)
    # version 1 predates the engine tag: the receiver's default stands in for it
    assert wire.decode(data) == dataclasses.replace(frame, engine=wire.UNKNOWN_ENGINE)


def test_version_2_frames_still_decode_as_engine_unknown() -> None:
    frame = sample_frame()
    data = as_v2(encode_v3(frame))
    assert struct.unpack(">4sHI", data[:10]) == (b"KCPF", 2, len(data) - 10)
    assert wire.decode(data) == dataclasses.replace(frame, engine="unknown")


def test_header_layout() -> None:
    data = encode_v3(sample_frame())
    magic, version, length = struct.unpack(">4sHI", data[:10])
    assert (magic, version, length) == (b"KCPF", 3, len(data) - 10)
    assert data[10:15] == b"\x04vllm"  # the engine tag: its length u8, then its bytes
    pid, seq, ts = struct.unpack_from(">IQd", data, 15)  # then a version 2 payload
    assert (pid, seq, ts) == (123, 7, 1700000000.5)


def test_v4_layout_key_first() -> None:
    f = sample_v4()
    data = wire.encode(f)
    magic, version, length = struct.unpack(">4sHI", data[:10])
    assert (magic, version, length) == (b"KCPF", 4, len(data) - 10)
    (key_len,) = struct.unpack_from(">H", data, 10)
    pid, k, t, mask, ne, np, ni, nl = struct.unpack_from(">IHBBBBBH", data, 12)
    assert (pid, k, t, ne, np, ni) == (123, 3, 3, 4, 7, 3)
    assert mask == 0b11101  # attention_seconds, kc_ratio, context_tokens; bit 4: K(C) by layer
    assert struct.unpack_from(">3I", data, 25) == (16, 32, 64)
    labels = data[37 : 12 + key_len]
    assert labels == b"vllmpython3abc0\x001\x00unknown" and nl == len(b"0\x001\x00unknown")
    seq, nan, inf, exc, internal, dropped = struct.unpack_from(">Q5I", data, 12 + key_len)
    assert (seq, nan, inf, exc, internal, dropped) == (7, 1, 0, 2, 5, 4)
    # the key says nothing that changes from one flush to the next
    later = dataclasses.replace(sample_v4(), seq=8, ts=1700000001.5, dropped=0)
    assert wire.encode(later)[: 12 + key_len] == data[: 12 + key_len]


def test_v4_kc_layers_with_nothing_observed_are_sent_as_zeros_and_read_as_absent() -> None:
    f = sample_v4()
    f.kc_by_layer["9"] = wire.Histogram.of(wire.KC_TOKENS)  # a layer with no row since
    got = wire.decode(wire.encode(f))
    assert set(got.kc_by_layer) == {"0", "1"}
    assert got.calls_by_layer["9"] == 0  # K(C) layers are layers: 0 calls this time


@pytest.mark.parametrize("engine", ["vllm", "kcops", "unknown", "sglang", "tgi", "e" * 16, "a-1_b"])
def test_engine_round_trips(engine: str) -> None:
    frame = dataclasses.replace(sample_frame(), engine=engine)
    assert wire.decode(wire.encode(frame)).engine == engine


HOSTILE_ENGINES = [
    "",  # empty
    "e" * 17,  # too long
    "VLLM",  # upper case
    "1vllm",  # not a letter first
    "vllm\x00",  # NUL
    "vl lm",
    'vllm",x="y',  # a label injection
    "vllm\n",
    "v\u00e9",  # not ASCII
    "_vllm",
]


@pytest.mark.parametrize("engine", HOSTILE_ENGINES)
def test_hostile_engine_tags_are_refused_by_both_sides(engine: str) -> None:
    good = encode_v3(sample_frame())
    with pytest.raises(wire.WireError, match="engine"):
        wire.decode(with_tag(good, engine.encode()))
    with pytest.raises(wire.WireError, match="engine"):
        wire.encode(dataclasses.replace(sample_frame(), engine=engine))
    with pytest.raises(wire.WireError, match="a-z, 0-9"):
        wire.check_engine(engine)


def test_engine_tag_length_must_agree() -> None:
    good = encode_v3(sample_frame())
    for length in (0, 3, 5, 200, 255):  # says 0, too few, too many, past the payload
        with pytest.raises(wire.WireError):
            wire.decode(with_tag(good, b"vllm", length))
    with pytest.raises(wire.WireError, match="truncated"):
        wire.decode(wire.HEADER.pack(wire.MAGIC, wire.VERSION, 0))  # no tag at all
    with pytest.raises(wire.WireError, match="engine"):
        wire.check_engine(None)


def test_refused_engine_tags_are_not_remembered() -> None:
    good = encode_v3(sample_frame())
    wire.decode(good)
    before = wire.engine_name.cache_info().currsize  # valid tags: a few, kept
    for i in range(200):  # a flood of distinct bad tags must not grow the decoder's state
        with pytest.raises(wire.WireError, match="engine tag"):
            wire.decode(with_tag(good, b"Bad%d" % i))
    assert wire.engine_name.cache_info().currsize == before


@given(st.one_of(st.text(max_size=24), st.text('az09_-A \x00\u00e9"=', max_size=20)))
def test_any_engine_either_round_trips_or_is_refused(engine: str) -> None:
    lower, rest = "abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnopqrstuvwxyz0123456789_-"
    valid = 1 <= len(engine) <= 16 and engine[0] in lower and all(c in rest for c in engine)
    frame = dataclasses.replace(sample_v4(), engine=engine)
    try:
        data = wire.encode(frame)
    except wire.WireError:
        assert not valid
        return
    assert valid and wire.decode(data) == frame


def test_histogram_buckets_are_le() -> None:
    h = wire.Histogram.of(wire.KC_TOKENS)
    h.observe(1)  # exactly on a bound: that bucket
    h.observe(1.5)
    h.observe(10**9)  # +Inf
    assert h.counts[0] == 1 and h.counts[1] == 1 and h.counts[-1] == 1
    assert h.cumulative()[-1] == (float("inf"), 3)
    assert h.sum == 1 + 1.5 + 10**9


def test_buckets_sorted_and_named() -> None:
    for name, bounds in wire.BUCKETS.items():
        assert list(bounds) == sorted(set(bounds)), name
        assert name.startswith("kcops_")
    assert wire.BUCKETS[wire.KC_RATIO][-1] == 1.0


@pytest.mark.parametrize(
    "data,match",
    [
        (b"", "truncated"),
        (b"KCPF\x00", "truncated"),
        (b"XXXX\x00\x01\x00\x00\x00\x02{}", "bad magic"),
        (b"KCPF\x00\x09\x00\x00\x00\x02{}", "unknown frame version 9"),
        (b"KCPF\x00\x02\x00\x00\x00\x02{}", "truncated"),
        (b"KCPF\x00\x01\x00\x00\x00\x05{}", "truncated"),
        (b"KCPF\x00\x01\x00\x00\x00\x02[]", "JSON object"),
        (b"KCPF\x00\x01\x00\x00\x00\x03{x}", "not JSON"),
        (b"KCPF\x00\x01\x00\x00\x00\x02{}", "pid"),
    ],
)
def test_decode_errors(data: bytes, match: str) -> None:
    with pytest.raises(wire.WireError, match=match):
        wire.decode(data)


def _with_body(**changes: object) -> bytes:
    data = encode_v1(sample_frame())
    body = json.loads(data[10:])
    body.update(changes)
    payload = json.dumps(body).encode()
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION_JSON, len(payload)) + payload


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"errors": {"oom": 1}}, "unknown error kind"),
        ({"hist": {"kcops_other": {"c": [], "s": 0, "n": 0}}}, "unknown histogram"),
        ({"hist": {"kcops_kc_ratio": {"c": [1], "s": 0, "n": 1}}}, "bucket counts"),
        ({"calls": {"0": -1}}, "integer in 0"),
        ({"topn": {"x": {"c": [], "s": 0, "n": 0}}}, "bad frame field"),
        ({"seq": "1"}, "seq"),
        ({"process": 5}, "strings"),
        # the bounds of version 2, applied to version 1 too
        ({"calls": {"0": 10**400}}, "integer in 0..2\\*\\*53"),
        ({"calls": {"0": 2**53 + 1}}, "integer in 0..2\\*\\*53"),
        ({"hist": {"kcops_kc_ratio": {"c": [0] * 19 + [1], "s": float("nan"), "n": 1}}}, "sum"),
        ({"hist": {"kcops_kc_ratio": {"c": [0] * 19 + [1], "s": float("inf"), "n": 1}}}, "sum"),
        ({"hist": {"kcops_kc_ratio": {"c": [0] * 19 + [1], "s": -1.0, "n": 1}}}, "sum"),
        ({"hist": {"kcops_kc_ratio": {"c": [0] * 20, "s": 0.0, "n": 1}}}, "count"),
        ({"ts": float("nan")}, "ts"),
        ({"process": "p" * 65}, "characters"),
        ({"calls": {"": 1}}, "characters"),
        ({"calls": {str(i): 1 for i in range(wire.MAX_LAYERS + 1)}}, "too many"),
        ({"topn": {str(i): {"c": [0] * 15, "s": 0, "n": 0} for i in range(1, 18)}}, "too many"),
    ],
)
def test_decode_rejects_bad_fields(changes: dict[str, object], match: str) -> None:
    with pytest.raises(wire.WireError, match=match):
        wire.decode(_with_body(**changes))


def test_wire_error_is_value_error() -> None:
    assert issubclass(wire.WireError, ValueError)


@given(st.binary(max_size=200))
def test_decode_never_raises_anything_else(data: bytes) -> None:
    try:
        wire.decode(data)
    except wire.WireError:
        pass


def _v2(frame: wire.Frame) -> bytearray:  # a version 3 frame: its body is version 2
    return bytearray(encode_v3(frame))


def _fixed_field(data: bytearray, fmt: str, offset: int, value: object) -> bytes:
    """Set a field of the version 2 payload, at ``offset`` past the engine tag."""
    struct.pack_into(fmt, data, 11 + data[10] + offset, value)
    return bytes(data)


def test_v2_rejects_out_of_range_fields() -> None:
    f = sample_frame()
    # ts at payload offset 12 (after pid u32, seq u64)
    for ts in (float("nan"), float("inf"), -1.0, 1e12):
        with pytest.raises(wire.WireError, match="ts"):
            wire.decode(_fixed_field(_v2(f), ">d", 12, ts))
    with pytest.raises(wire.WireError, match="layers"):  # layer count u16 at offset 36
        wire.decode(_fixed_field(_v2(f), ">H", 36, wire.MAX_LAYERS + 1))
    with pytest.raises(wire.WireError, match="mask"):  # histogram mask u8 at offset 39
        wire.decode(_fixed_field(_v2(f), ">B", 39, 0xFF))
    data = _v2(f)
    for bad in (float("nan"), float("inf"), -0.5, 1e300):  # the last sum: the last 8 bytes
        struct.pack_into(">d", data, len(data) - 8, bad)
        with pytest.raises(wire.WireError, match="sum"):
            wire.decode(bytes(data))


def test_v2_rejects_bad_labels() -> None:
    f = sample_frame()
    f.calls_by_layer = {"ab": 1, "cd": 2}
    data = encode_v3(f)
    with pytest.raises(wire.WireError, match="distinct"):
        wire.decode(data.replace(b"ab\0cd", b"ab\0ab"))  # distinct names: 1 for 2 counts
    with pytest.raises(wire.WireError, match=r"NUL|empty"):
        wire.decode(data.replace(b"ab\0cd", b"ab\0\0d"))
    with pytest.raises(wire.WireError, match="UTF-8"):
        wire.decode(data.replace(b"ab\0cd", b"ab\0\xff\xfe"))
    with pytest.raises(wire.WireError, match="truncated"):
        wire.decode(data[:10] + data[10:] + b"\0")  # length in the header then disagrees
    with pytest.raises(wire.WireError):
        wire.decode(wire.HEADER.pack(wire.MAGIC, 3, len(data) - 9) + data[10:] + b"\0")


def _v4_numbers_at(data: bytes) -> int:
    return 12 + struct.unpack_from(">H", data, 10)[0]


def _set(data: bytes, fmt: str, offset: int, value: object) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def test_v4_rejects_out_of_range_fields() -> None:
    data = wire.encode(sample_v4())
    lay = wire.layout(3, 0b11101, 3)
    floats_at = _v4_numbers_at(data) + 8 + 4 * lay.lanes
    for ts in (float("nan"), float("inf"), -1.0, 1e12):  # ts: the first float
        with pytest.raises(wire.WireError, match="ts"):
            wire.decode(_set(data, ">d", floats_at, ts))
    for i in range(1, lay.floats):  # every sum, K(C) by layer included
        for bad in (float("nan"), float("-inf"), -0.5, 1e300):
            with pytest.raises(wire.WireError, match="sum"):
                wire.decode(_set(data, ">d", floats_at + 8 * i, bad))
    with pytest.raises(wire.WireError, match="layers"):  # k u16 at 16
        wire.decode(_set(data, ">H", 16, wire.MAX_LAYERS + 1))
    with pytest.raises(wire.WireError, match="mask"):  # mask u8 at 19
        wire.decode(_set(data, ">B", 19, 0x20))
    with pytest.raises(wire.WireError, match="top-N"):  # top-N count u8 at 18
        wire.decode(_set(data, ">B", 18, wire.MAX_TOPN + 1))
    for ns in ((32, 16, 64), (16, 16, 64), (0, 32, 64), (16, 32, wire.MAX_TOPN_N + 1)):
        bad = data
        for j, n in enumerate(ns):
            bad = _set(bad, ">I", 25 + 4 * j, n)
        with pytest.raises(wire.WireError, match="ascending"):
            wire.decode(bad)
    for length in (0, 5, 30, 200, 60_000):  # key length u16 at 10 disagreeing
        with pytest.raises(wire.WireError):
            wire.decode(_set(data, ">H", 10, length))
    for field, value in ((20, 17), (21, 0), (22, 200), (23, 9)):  # label lengths u8
        with pytest.raises(wire.WireError):
            wire.decode(_set(data, ">B", field, value))


def test_v4_rejects_bad_labels() -> None:
    f = sample_v4()
    f.calls_by_layer = {"ab": 1, "cd": 2}
    f.kc_by_layer = {}
    data = wire.encode(f)
    with pytest.raises(wire.WireError, match="distinct"):
        wire.decode(data.replace(b"ab\0cd", b"ab\0ab"))
    with pytest.raises(wire.WireError, match=r"NUL|empty"):
        wire.decode(data.replace(b"ab\0cd", b"ab\0\0d"))
    for bad in (b"ab\0\xff\xfe", b"ab\0\xed\xa0", b"\xc0\x80\0cd"):  # not UTF-8 (surrogates)
        with pytest.raises(wire.WireError, match="UTF-8"):
            wire.decode(data.replace(b"ab\0cd", bad[:5]))
    with pytest.raises(wire.WireError, match="engine"):
        wire.decode(data.replace(b"vllm", b"VLLM"))
    with pytest.raises(wire.WireError, match="truncated"):
        wire.decode(data + b"\0")  # the header's length then disagrees
    with pytest.raises(wire.WireError, match="lengths and counts"):
        grown = data + b"\0"
        wire.decode(wire.HEADER.pack(wire.MAGIC, 4, len(grown) - 10) + grown[10:])
    for cut in (11, 13, 30, len(data) - 1):
        with pytest.raises(wire.WireError):
            short = data[:cut]
            wire.decode(wire.HEADER.pack(wire.MAGIC, 4, len(short) - 10) + short[10:])


def test_v4_split_keeps_kc_with_its_layer() -> None:
    frame = sample_v4()
    frame.calls_by_layer = {f"layer-{i:04d}": i for i in range(1200)}
    kc = wire.Histogram.of(wire.KC_TOKENS)
    kc.observe(7)
    frame.kc_by_layer = {f"layer-{i:04d}": kc for i in range(0, 1200, 3)}
    parts = wire.split(frame)
    assert len(parts) > 1
    calls: dict[str, int] = {}
    kcs: dict[str, int] = {}
    for p in parts:
        got = wire.decode(wire.encode(p))
        calls.update(got.calls_by_layer)
        kcs.update({k: h.count for k, h in got.kc_by_layer.items()})
    assert calls == frame.calls_by_layer
    assert kcs == {k: 1 for k in frame.kc_by_layer}
    assert [p.internal_errors for p in parts] == [5] + [0] * (len(parts) - 1)
    assert [p.dropped for p in parts] == [4] + [0] * (len(parts) - 1)


def test_encode_clips_labels_and_refuses_what_decode_would() -> None:
    f = sample_frame()
    f.process = "p" * 200
    f.calls_by_layer = {"x" * 100: 1, "x" * 90: 2}  # the same name once clipped: summed
    got = wire.decode(wire.encode(f))
    assert got.process == "p" * wire.MAX_LABEL_CHARS
    assert got.calls_by_layer == {"x" * wire.MAX_LABEL_CHARS: 3}
    f.histograms[wire.KC_RATIO].sum = float("nan")
    with pytest.raises(wire.WireError, match="sum"):
        wire.encode(f)
    f = sample_frame()
    f.calls_by_layer = {"0": 2**32}
    with pytest.raises(wire.WireError, match="out of range"):
        wire.encode(f)


def test_count_is_the_bucket_total() -> None:
    h = wire.Histogram.of(wire.KC_RATIO)
    h.observe(0.3)
    h.merge(h)
    assert h.count == 2 == h.cumulative()[-1][1]


def test_le_formatting_is_prometheus_own() -> None:
    from prometheus_client.utils import floatToGoString

    for bounds in (*wire.BUCKETS.values(), (1e6, 2.5e7, 123456789.0, 0.1, 1.0)):
        h = wire.Histogram(tuple(sorted(bounds)))
        assert h.les() == [floatToGoString(b) for b in (*sorted(bounds), float("inf"))]


def test_split_large_frame() -> None:
    frame = sample_frame()
    frame.calls_by_layer = {f"layer-{i:06d}": 10**9 + i for i in range(5000)}
    with pytest.raises(wire.WireError, match=r"exceeds|more than"):
        wire.encode(frame)
    parts = wire.split(frame)
    assert len(parts) > 1
    assert [p.seq for p in parts] == list(range(7, 7 + len(parts)))
    merged: dict[str, int] = {}
    for p in parts:
        assert len(wire.encode(p)) <= wire.MAX_FRAME_BYTES
        merged.update(p.calls_by_layer)
    assert merged == frame.calls_by_layer
    assert parts[0].errors == frame.errors
    assert all(not p.errors for p in parts[1:])
    assert {p.engine for p in parts} == {"vllm"}


def test_small_frame_is_not_split() -> None:
    frame = sample_frame()
    assert wire.split(frame) == [frame]


def test_default_socket_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOPS_PROBE_SOCKET", "/run/x.sock")
    assert wire.default_socket_path() == "/run/x.sock"
    monkeypatch.delenv("KCOPS_PROBE_SOCKET")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert wire.default_socket_path() == "/run/user/1000/kcops/probe.sock"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    import os

    assert wire.default_socket_path() == f"/tmp/kcops-{os.getuid()}/probe.sock"
