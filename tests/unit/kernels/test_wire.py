"""The probe frame format (``wire.VERSION``, the one version): round trip, typed errors, bounds,
fixed buckets, socket path."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcops.kernels import wire

V = wire.VERSION.to_bytes(2, "big")  # the header's version field, as frames carry it


def sample_frame() -> wire.Frame:
    """A frame without K(C) by layer nor internal errors."""
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
    return dataclasses.replace(f, kc_by_layer=kc, internal_errors=5, dropped=4)


def with_tag(data: bytes, tag: bytes, length: int | None = None) -> bytes:
    """``data`` with its engine tag replaced by ``tag`` (and its length byte by ``length``)."""
    (key_len,) = struct.unpack_from(">H", data, 10)
    key, numbers = bytearray(data[12 : 12 + key_len]), data[12 + key_len :]
    t, ne = key[6], key[8]
    at = wire.KEY_FIXED.size + 4 * t
    key[at : at + ne] = tag
    key[8] = len(tag) if length is None else length
    payload = struct.pack(">H", len(key)) + key + numbers
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION, len(payload)) + payload


def test_round_trip() -> None:
    frame = sample_v4()
    data = wire.encode(frame)
    assert data[:6] == wire.MAGIC + V
    assert wire.decode(data) == frame


def test_header_layout() -> None:
    data = wire.encode(sample_v4())
    magic, version, length = struct.unpack(">4sHI", data[:10])
    assert (magic, version, length) == (b"KCPF", 6, len(data) - 10)
    assert wire.header(data) == (6, len(data) - 10)


def test_v6_layout_key_first() -> None:
    f = sample_v4()
    for name in wire.REQUEST_HISTOGRAMS:
        del f.histograms[name]
    f.histograms[wire.REQUEST_CONTEXT] = wire.Histogram.of(wire.REQUEST_CONTEXT)
    f.model, f.tenant, f.p = "smollm2", "acme", 0.8
    data = wire.encode(f)
    magic, version, length = struct.unpack(">4sHI", data[:10])
    assert (magic, version, length) == (b"KCPF", 6, len(data) - 10)
    (key_len,) = struct.unpack_from(">H", data, 10)
    pid, k, t, mask, ne, np, ni, nm, nt, pu, nl = struct.unpack_from(">IHBBBBBBBHH", data, 12)
    assert (pid, k, t, ne, np, ni, nm, nt, pu) == (123, 3, 3, 4, 7, 3, 7, 4, 8000)
    # attention_seconds, kc_ratio, context_tokens, request context (bit 4); bit 7: K(C) by layer
    assert mask == 0b10011101
    assert struct.unpack_from(">3I", data, 29) == (16, 32, 64)
    labels = data[41 : 12 + key_len]
    assert labels == b"vllmpython3abcsmollm2acme0\x001\x00unknown"
    assert nl == len(b"0\x001\x00unknown")
    assert wire.decode(data) == f
    seq, nan, inf, exc, internal, dropped = struct.unpack_from(">Q5I", data, 12 + key_len)
    assert (seq, nan, inf, exc, internal, dropped) == (7, 1, 0, 2, 5, 4)
    # the key says nothing that changes from one flush to the next
    later = dataclasses.replace(f, seq=8, ts=1700000001.5, dropped=0)
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
    good = wire.encode(sample_frame())
    assert wire.decode(with_tag(good, b"vllm")) == sample_frame()  # the helper is faithful
    with pytest.raises(wire.BadField, match="engine") as refused:
        wire.decode(with_tag(good, engine.encode()))
    assert refused.value.name == "engine" and refused.value.value == engine.encode()
    with pytest.raises(wire.BadField, match="engine"):
        wire.encode(dataclasses.replace(sample_frame(), engine=engine))
    with pytest.raises(wire.BadField, match="a-z, 0-9") as refused:
        wire.check_engine(engine)
    assert refused.value.allowed == wire.ENGINE_ALLOWED


def test_engine_tag_length_must_agree() -> None:
    good = wire.encode(sample_frame())
    for length in (0, 3, 5, 200, 255):  # says 0, too few, too many, past the payload
        with pytest.raises(wire.BadField):
            wire.decode(with_tag(good, b"vllm", length))
    with pytest.raises(wire.Truncated, match="truncated"):
        wire.decode(wire.HEADER.pack(wire.MAGIC, wire.VERSION, 0))  # no key at all
    with pytest.raises(wire.BadField, match="engine"):
        wire.check_engine(None)


def test_refused_engine_tags_are_not_remembered() -> None:
    good = wire.encode(sample_frame())
    wire.decode(good)
    before = wire.engine_name.cache_info().currsize  # valid tags: a few, kept
    for i in range(200):  # a flood of distinct bad tags must not grow the decoder's state
        with pytest.raises(wire.BadField, match="engine"):
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
    "data,error,match",
    [
        (b"", wire.Truncated, "truncated"),
        (b"KCPF\x00", wire.Truncated, "truncated"),
        (b"XXXX" + V + b"\x00\x00\x00\x02{}", wire.BadMagic, "bad magic"),
        (b"KCPF\x00\x09\x00\x00\x00\x02{}", wire.BadVersion, "unknown frame version 9"),
        # versions 1 (JSON), 2 and 3 were read before 1.0: now they are unknown versions
        (
            b"KCPF\x00\x01\x00\x00\x00\x02{}",
            wire.BadVersion,
            f"version 1, this side speaks {wire.VERSION}",
        ),
        # version 5 (no p, no tenant) is refused by name, not misread
        (b"KCPF\x00\x05\x00\x00\x00\x02{}", wire.BadVersion, "unknown frame version 5"),
        (b"KCPF\x00\x03\x00\x00\x00\x02{}", wire.BadVersion, "unknown frame version 3"),
        (b"KCPF" + V + b"\x00\x00\x00\x05{}", wire.Truncated, "truncated"),
        (b"KCPF" + V + b"\x00\x00\x00\x02{}", wire.Truncated, "ends inside a field"),
        (b"KCPF" + V + b"\x00\x00\xff\xff" + bytes(65535), wire.TooLarge, "exceeds"),
        (b"KCPF" + V + b"\x00\x00\x00\x01{}", wire.BadField, "payload length"),
    ],
)
def test_decode_errors_are_typed(data: bytes, error: type[wire.WireError], match: str) -> None:
    with pytest.raises(error, match=match) as refused:
        wire.decode(data)
    assert type(refused.value) is error  # the type says why, not just the message


def test_error_types_carry_the_counters_labels() -> None:
    kinds = (wire.Truncated, wire.BadMagic, wire.BadVersion, wire.TooLarge, wire.BadField)
    assert all(issubclass(k, wire.WireError) for k in kinds)
    assert {k.reason for k in kinds} == {
        "truncated", "bad_magic", "bad_version", "too_large", "bad_field"
    }  # fmt: skip
    assert {k: k.outcome for k in kinds if k.outcome != "malformed"} == {
        wire.BadVersion: "unknown_version"
    }
    e = wire.BadField("ts", float("nan"), "0..1e+11")
    assert (e.name, e.allowed, str(e)) == ("ts", "0..1e+11", "ts nan not allowed: 0..1e+11")


def test_wire_error_is_value_error() -> None:
    assert issubclass(wire.WireError, ValueError)


@given(st.binary(max_size=200))
def test_decode_never_raises_anything_else(data: bytes) -> None:
    try:
        wire.decode(data)
    except wire.WireError:
        pass


@given(st.binary(max_size=200), st.integers(0, 10**6))
def test_decode_of_a_valid_frame_cut_or_grown_raises_only_wire_errors(
    tail: bytes, cut: int
) -> None:
    data = wire.encode(sample_v4())
    for bad in (data[: cut % len(data)], data + tail, data[:12] + tail + data[12:]):
        try:
            wire.decode(bad)
        except wire.WireError:
            pass


def _v4_numbers_at(data: bytes) -> int:
    return 12 + struct.unpack_from(">H", data, 10)[0]


def _set(data: bytes, fmt: str, offset: int, value: object) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _refused(data: bytes, error: type[wire.WireError] = wire.BadField, name: str = "") -> None:
    """``data`` is refused with ``error`` (a BadField naming ``name``, when given)."""
    with pytest.raises(error) as refused:
        wire.decode(data)
    if name:
        assert isinstance(refused.value, wire.BadField) and refused.value.name == name


def test_v4_rejects_out_of_range_fields() -> None:
    data = wire.encode(sample_v4())
    lay = wire.layout(3, 0b11111101, 3)  # every plain histogram but kc_tokens; K(C) by layer
    floats_at = _v4_numbers_at(data) + 8 + 4 * lay.lanes
    for ts in (float("nan"), float("inf"), -1.0, 1e12):  # ts: the first float
        _refused(_set(data, ">d", floats_at, ts), name="ts")
    for i in range(1, lay.floats):  # every sum, K(C) by layer included
        for bad_sum in (float("nan"), float("-inf"), -0.5, 1e300):
            _refused(_set(data, ">d", floats_at + 8 * i, bad_sum), name="histogram sum")
    _refused(_set(data, ">H", 16, wire.MAX_LAYERS + 1), name="layers")  # k u16 at 16
    # mask u8 at 19: since version 5 every one of its 8 bits means something
    _refused(_set(data, ">B", 18, wire.MAX_TOPN + 1), name="top-N entries")  # u8 at 18
    for ns in ((32, 16, 64), (16, 16, 64), (0, 32, 64), (16, 32, wire.MAX_TOPN_N + 1)):
        bad = data
        for j, n in enumerate(ns):
            bad = _set(bad, ">I", 29 + 4 * j, n)
        _refused(bad, name="top-N keys")
    for length in (0, 5, 30, 200, 60_000):  # key length u16 at 10 disagreeing
        with pytest.raises(wire.WireError):
            wire.decode(_set(data, ">H", 10, length))
    for field, value in ((20, 17), (21, 0), (22, 200), (23, 9), (24, 9), (28, 1)):  # lengths
        with pytest.raises(wire.WireError):
            wire.decode(_set(data, ">B", field, value))
    for units in (0, wire.P_SCALE + 1, 0xFFFF):  # p u16 at 25: in (0, 1]
        _refused(_set(data, ">H", 25, units), name="p")


def test_v4_rejects_bad_labels() -> None:
    f = sample_v4()
    f.calls_by_layer = {"ab": 1, "cd": 2}
    f.kc_by_layer = {}
    data = wire.encode(f)
    _refused(data.replace(b"ab\0cd", b"ab\0ab"), name="distinct layer names")
    _refused(data.replace(b"ab\0cd", b"ab\0\0d"), name="layer names")  # an empty name
    for bad in (b"ab\0\xff\xfe", b"ab\0\xed\xa0", b"\xc0\x80\0cd"):  # not UTF-8 (surrogates)
        with pytest.raises(wire.BadField, match="UTF-8"):
            wire.decode(data.replace(b"ab\0cd", bad[:5]))
    _refused(data.replace(b"vllm", b"VLLM"), name="engine")
    _refused(data.replace(b"python3", b"pyth\0n3"), name="label")  # a NUL in the process
    _refused(data + b"\0", name="payload length")  # the header's length then disagrees
    grown = data + b"\0"
    _refused(
        wire.HEADER.pack(wire.MAGIC, wire.VERSION, len(grown) - 10) + grown[10:],
        name="payload length",
    )
    for cut in (11, 13, 30, len(data) - 1):
        with pytest.raises(wire.WireError):
            short = data[:cut]
            wire.decode(wire.HEADER.pack(wire.MAGIC, wire.VERSION, len(short) - 10) + short[10:])


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
    with pytest.raises(wire.BadField, match="histogram sum"):
        wire.encode(f)
    f = sample_frame()
    f.calls_by_layer = {"0": 2**32}
    with pytest.raises(wire.BadField, match="a count: u32"):
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
    with pytest.raises(wire.BadField, match="split it"):  # more than MAX_LAYERS
        wire.encode(frame)
    frame.calls_by_layer = {f"layer-{i:06d}" * 5: i for i in range(1000)}  # fewer, longer
    with pytest.raises(wire.TooLarge, match="exceeds"):
        wire.encode(frame)
    frame.calls_by_layer = {f"layer-{i:06d}": 10**9 + i for i in range(5000)}
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


@pytest.mark.parametrize("p", [0.5, 0.8, 0.9, 0.95, 0.999, 1.0])
def test_p_and_tenant_round_trip(p: float) -> None:
    frame = dataclasses.replace(sample_v4(), p=p, tenant="team-a")
    got = wire.decode(wire.encode(frame))
    assert (got.p, got.tenant) == (p, "team-a")


@pytest.mark.parametrize("p", [0.0, -0.1, 1.5, float("nan"), float("inf")])
def test_encode_refuses_a_p_outside_0_1(p: float) -> None:
    with pytest.raises(wire.BadField, match=r"p .* not allowed: in \(0, 1\]"):
        wire.encode(dataclasses.replace(sample_v4(), p=p))
