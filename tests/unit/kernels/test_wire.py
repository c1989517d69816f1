"""The probe frame format: round trip, typed errors, fixed buckets, socket path."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kcops.kernels import wire


def sample_frame() -> wire.Frame:
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
    )


def test_round_trip() -> None:
    frame = sample_frame()
    data = wire.encode(frame)
    assert data[:4] == wire.MAGIC
    assert wire.decode(data) == frame


def test_header_layout() -> None:
    data = wire.encode(sample_frame())
    magic, version, length = struct.unpack(">4sHI", data[:10])
    assert (magic, version, length) == (b"KCPF", 1, len(data) - 10)
    body = json.loads(data[10:])
    assert body["calls"]["0"] == 3
    assert body["hist"]["kcops_kc_tokens"]["n"] == 1


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
    data = wire.encode(sample_frame())
    body = json.loads(data[10:])
    body.update(changes)
    payload = json.dumps(body).encode()
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION, len(payload)) + payload


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"errors": {"oom": 1}}, "unknown error kind"),
        ({"hist": {"kcops_other": {"c": [], "s": 0, "n": 0}}}, "unknown histogram"),
        ({"hist": {"kcops_kc_ratio": {"c": [1], "s": 0, "n": 1}}}, "bucket counts"),
        ({"calls": {"0": -1}}, "non-negative"),
        ({"topn": {"x": {"c": [], "s": 0, "n": 0}}}, "bad frame field"),
        ({"seq": "1"}, "seq"),
        ({"process": 5}, "strings"),
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


def test_split_large_frame() -> None:
    frame = sample_frame()
    frame.calls_by_layer = {f"layer-{i:06d}": 10**9 + i for i in range(5000)}
    with pytest.raises(wire.WireError, match="exceeds"):
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
