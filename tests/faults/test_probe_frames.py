"""Hostile probe frames: fuzzed frames never raise anything but WireError, never reach the
store out of range or with text UTF-8 cannot encode, frames of other versions (1 to 3 were
read before 1.0) are refused as unknown, and a burst from 1,000 processes leaves memory
bounded."""

from __future__ import annotations

import dataclasses
import math
import socket
import struct
import time

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kcops.agent.collectors.probe import ProbeReceiver
from kcops.kernels import wire
from tests.faults.conftest import RealAgent, start_agent, stop_agent
from tests.services import wait_until
from tests.unit.kernels.test_wire import sample_frame, sample_v4

GOOD = wire.encode(dataclasses.replace(sample_v4(), model="smollm2"))
BASES = {"v4": GOOD, "plain": wire.encode(sample_frame())}  # K(C) by layer, and without


def _check(frame: wire.Frame) -> None:
    """What a decoded frame guarantees the receiver and the store."""
    counts = (*frame.calls_by_layer.values(), *frame.errors.values())
    for v in (*counts, frame.internal_errors, frame.dropped):
        assert 0 <= v <= wire.MAX_U32
    hists = (*frame.histograms.values(), *frame.topn_mass.values(), *frame.kc_by_layer.values())
    for h in hists:
        assert math.isfinite(h.sum) and 0 <= h.sum <= wire.MAX_SUM
        assert len(h.counts) == len(h.bounds) + 1 and min(h.counts) >= 0
    assert 0 <= frame.ts <= wire.MAX_TS
    labels = [frame.process, frame.instance, *frame.calls_by_layer, *frame.kc_by_layer]
    assert all(len(x) <= wire.MAX_LABEL_CHARS and "\x00" not in x for x in labels)
    for x in labels:
        x.encode()  # UTF-8 can encode it: /metrics and OTLP will take it
    assert wire.check_engine(frame.engine) == frame.engine
    assert len(frame.calls_by_layer) <= wire.MAX_LAYERS and len(frame.topn_mass) <= wire.MAX_TOPN
    assert set(frame.kc_by_layer) <= set(frame.calls_by_layer)


REFUSALS = (wire.Truncated, wire.BadMagic, wire.BadVersion, wire.TooLarge, wire.BadField)


def _verdict(data: bytes) -> wire.Frame | None:
    """Decode: a frame in bounds, or None for a WireError of one of the five kinds the
    receiver counts by; anything else fails the test."""
    try:
        frame = wire.decode(data)
    except wire.WireError as exc:
        assert type(exc) in REFUSALS, repr(exc)
        return None
    _check(frame)
    return frame


def _fields(data: bytes) -> list[tuple[int, str]]:
    """(offset, struct format) of every fixed-width field of the frame ``data``."""
    out = [(4, ">H"), (6, ">I")]
    (klen,) = struct.unpack_from(">H", data, 10)
    out += [(10, ">H"), (12, ">I"), (16, ">H"), (18, ">B"), (19, ">B"), (20, ">B")]
    out += [(21, ">B"), (22, ">B"), (23, ">H")]
    t = data[18]
    out += [(25 + 4 * j, ">I") for j in range(t)]
    at = 12 + klen
    lay = wire.layout(*struct.unpack_from(">H", data, 16), data[19], t)
    out.append((at, ">Q"))
    out += [(at + 8 + 4 * i, ">I") for i in range(lay.lanes)]
    out += [(at + 8 + 4 * lay.lanes + 8 * i, ">d") for i in range(lay.floats)]
    return out


HOSTILE_FLOATS = [math.nan, math.inf, -math.inf, -0.0, -1e-300, 5e-324, 2.0**49, 1e18, 1.1e18,
                  wire.MAX_TS, 1e11 + 1, 1e300, -2.0]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(BASES)), st.data())
def test_binary_fields_set_to_hostile_values(base: str, data: st.DataObject) -> None:
    """Every fixed-width field, set to its extremes or to noise."""
    frame = bytearray(BASES[base])
    fields = _fields(bytes(frame))
    for _ in range(data.draw(st.integers(1, 3))):
        off, fmt = data.draw(st.sampled_from(fields))
        if fmt == ">d":
            value: object = data.draw(st.one_of(st.sampled_from(HOSTILE_FLOATS), st.floats()))
        else:
            top = 2 ** (8 * struct.calcsize(fmt)) - 1
            value = data.draw(st.one_of(st.sampled_from([0, 1, top, top - 1]), st.integers(0, top)))
        struct.pack_into(fmt, frame, off, value)
    _verdict(bytes(frame))


def _label_spans(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of the engine, process, instance, model and layer-name bytes of a v5
    frame."""
    t, ne, np, ni, nm, nl = (
        data[18],
        data[20],
        data[21],
        data[22],
        data[23],
        struct.unpack_from(">H", data, 24)[0],
    )
    at = 26 + 4 * t
    spans = []
    for n in (ne, np, ni, nm, nl):
        spans.append((at, at + n))
        at += n
    return spans


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_label_bytes_of_any_kind(data: st.DataObject) -> None:
    """Labels of random bytes (bad UTF-8, CESU-8 surrogates, NULs, overlong forms), their
    lengths kept: decoded strictly or refused, never let through unencodable."""
    frame = bytearray(GOOD)
    spans = _label_spans(bytes(frame))
    start, end = data.draw(st.sampled_from(spans))
    pieces = st.sampled_from([b"\xed\xa0\x80", b"\xc0\x80", b"\x00", b"\xff", b"\xf4\x90\x80\x80",
                              "é".encode(), b"a", "\U0001f600".encode()])  # fmt: skip
    raw = b"".join(data.draw(st.lists(pieces, min_size=1, max_size=end - start)))
    raw = (raw + b"a" * (end - start))[: end - start]
    frame[start:end] = raw
    got = _verdict(bytes(frame))
    r = ProbeReceiver("/nonexistent/probe.sock")
    r.feed(bytes(frame))
    assert r.frames["ok"] == (got is not None)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_frames_decode_in_bounds_or_raise_wire_error(data: st.DataObject) -> None:
    base = bytearray(data.draw(st.sampled_from(list(BASES.values()))))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        base = base[: data.draw(st.integers(0, len(base)))]
    _verdict(bytes(base))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_payloads_behind_a_valid_header(payload: bytes) -> None:
    _verdict(wire.HEADER.pack(wire.MAGIC, wire.VERSION, len(payload)) + payload)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(list(BASES.values())), min_size=1, max_size=6), st.data())
def test_a_hostile_stream_never_raises_and_never_runs_ahead(
    parts: list[bytes], data: st.DataObject
) -> None:
    """The stream socket's bytes: frames, torn frames, garbage. The receiver counts, never
    raises, and never reports having taken more bytes than it was given."""
    stream = bytearray(b"".join(parts))
    for _ in range(data.draw(st.integers(0, 4))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    r = ProbeReceiver("/nonexistent/probe.sock")
    took = r._consume(bytes(stream))
    assert -1 <= took <= len(stream)
    out = r.collect(0.0)
    assert all(math.isfinite(x.value) for x in out)


OLD_VERSIONS = [
    (1, b'{"pid": ' + b"1" * 5000 + b', "seq": 0}'),  # version 1 was JSON
    (1, b"[" * 50_000),  # deep nesting, for a parser that would read it
    (2, GOOD[10:]),  # a version 5 payload behind another version's header
    (3, b"\x04vllm" + bytes(60)),  # version 3: an engine tag first
    (0, b""),
    (4, GOOD[10:]),  # version 4: no model in the key, no request histograms
    (5, GOOD[10:]),  # version 5: no tenant and no p in the key
    (wire.VERSION + 1, GOOD[10:]),  # a version after this one
    (0xFFFF, b"x"),
]


@pytest.mark.parametrize("version,body", OLD_VERSIONS, ids=range(len(OLD_VERSIONS)))
def test_other_versions_are_refused_as_unknown_whatever_they_carry(
    version: int, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Versions 1 to 5 (before 1.0, before request histograms, before tenant and p) and any
    other: BadVersion, counted unknown_version (one line), their payload never parsed, and
    the frame after them still read."""
    data = wire.HEADER.pack(wire.MAGIC, version, len(body)) + body
    with pytest.raises(wire.BadVersion) as refused:
        wire.decode(data)
    assert refused.value.version == version
    r = ProbeReceiver("/nonexistent/probe.sock")
    assert r._consume(data + GOOD) == len(data) + len(GOOD)  # skipped by its length
    assert r.frames["unknown_version"] == 1 and r.frames["ok"] == 1
    assert r.refused == {"bad_version": 1}
    assert "Traceback" not in caplog.text and "decoder bug" not in caplog.text


def test_a_label_utf8_cannot_encode_never_fails_the_metrics_page() -> None:
    """Defence in depth behind the decoders: the exporter escapes it, in both formats and
    in OTLP, instead of failing every scrape."""
    from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
    from opentelemetry.sdk.resources import Resource

    from kcops.agent.exporter import StoreExporter, render
    from kcops.agent.otlp_metrics import build_metrics_data
    from kcops.agent.samples import Sample
    from kcops.agent.signals import register_all
    from kcops.agent.store import Store

    store = Store()
    register_all(store)
    bad = (("engine", "x"), ("layer", "0"), ("process", "a\ud800b"))
    store.add([Sample("kcops_attention_calls_total", bad, 3.0)], 100.0)
    store.add([Sample("kcops_probe_frames_total", (("outcome", "ok"),), 2.0)], 100.0)
    registry = StoreExporter(store, lambda: 100.0, 30.0)
    for accept in (None, "application/openmetrics-text; version=1.0.0"):
        body, _ = render(registry, accept)
        text = body.decode()
        assert 'process="a\\\\ud800b"} 3.0' in text, text
        assert 'kcops_probe_frames_total{outcome="ok"} 2.0' in text
    data = build_metrics_data(
        store, 100.0, started_at=0.0, stale_after_s=30.0, resource=Resource.create({})
    )
    assert b"a\\ud800b" in encode_metrics(data).SerializeToString()


def test_one_bad_frame_never_disables_the_receiver() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    many = struct.pack(">H", wire.MAX_LAYERS + 1)
    for bad in (
        GOOD[:16] + many + GOOD[18:],  # more layers than a frame may hold
        GOOD[:-8] + struct.pack(">d", math.nan),
        wire.HEADER.pack(wire.MAGIC, wire.VERSION, 60) + b"\xff" * 60,
    ):
        r.feed(bad)
    r.feed(GOOD)
    for _ in range(3):
        out = r.collect(0.0)
        assert all(math.isfinite(s.value) for s in out)
    assert r.frames["ok"] == 1 and r.frames["malformed"] == 3


def _burst_frame(i: int) -> wire.Frame:
    f = sample_v4()
    f.pid, f.process, f.instance = 10_000 + i, f"proc-{i}", f"inst-{i}"
    f.calls_by_layer = {str(layer): 3 for layer in range(30)}
    f.kc_by_layer = {str(layer): f.kc_by_layer["0"] for layer in range(30)}
    return f


def _burst(agent: RealAgent, processes: int) -> None:
    """One frame from each of ``processes`` distinct processes, as probes send them: a
    connection each, one frame."""
    for i in range(processes):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.settimeout(5.0)
            for _ in range(5000):  # the agent's backlog is full: EAGAIN until it accepts
                try:
                    c.connect(str(agent.probe_socket))
                    break
                except BlockingIOError:
                    time.sleep(0.001)
            c.sendall(wire.encode(_burst_frame(i)))


def _metric(agent: RealAgent, series: str) -> float:
    """One series' value on the agent's /metrics (``name`` or ``name{labels}``)."""
    for line in httpx.get(agent.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {series} on /metrics")


def _store_bytes(agent: RealAgent) -> int:
    """The store's own estimate of what it holds, from the agent's /metrics."""
    return int(_metric(agent, "kcops_store_bytes"))


def _settled(agent: RealAgent, window_s: float, spread_b: int) -> tuple[int, int, int]:
    """The agent's RSS, its store's own estimate and that estimate's lowest value over the
    last ``window_s``, once RSS beside the store (RSS less the store's bytes) has moved by
    at most ``spread_b`` over that window.

    The store is held to its budget by an eviction every EVICT_EVERY_TICKS ticks and may
    overshoot between two (agent/store.py): its lowest value over a window longer than
    that interval is the one the budget bounds.

    The store grows by its samples every tick, so RSS alone never settles; what is beside
    it does, within the allocator's few-MiB steps (measured: 62-66 MiB over 2 minutes
    after the burst). A leak, such as the NVML traceback that grew RSS ~4 MiB/s
    (docs/benchmarks.md), never settles, and the wait fails.
    """
    seen: list[tuple[float, int, int]] = []

    def steady() -> tuple[int, int, int] | None:
        rss, store = agent.rss_bytes(), _store_bytes(agent)
        now = time.monotonic()
        seen.append((now, rss - store, store))
        beside = [b for t, b, _ in seen if t >= now - window_s]
        if now - seen[0][0] < window_s or max(beside) - min(beside) > spread_b:
            return None
        return rss, store, min(st for t, _, st in seen if t >= now - window_s)

    what = f"RSS beside the store to stay within {spread_b >> 20} MiB for {window_s:.0f}s"

    def tail() -> str:
        return f"RSS less store, MiB: {[round(b / 2**20, 1) for _, b, _ in seen[-20:]]}"

    return wait_until(steady, 180, what, tail, interval_s=0.5)


@pytest.mark.slow
def test_burst_from_1000_processes_then_rss_returns(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """RSS once settled after a burst: the store grew within its budget and the rest is back
    within 40% of before; and RSS beside the store settles (a leak would keep it climbing)."""
    # 1,000 stream connections come and go faster than the agent's 25 ms reads close them:
    # room for all of them (the cap and its refusals are tested in tests/unit/collectors)
    tmp = tmp_path_factory.mktemp("burst")
    probe = {"socket_path": str(tmp / "probe.sock"), "max_connections": 1024}  # as start_agent's
    agent = start_agent(
        tmp, extra={"store": {"max_bytes": 64 << 20}, "collectors": {"probe": probe}}
    )
    try:
        before, store_before, _ = _settled(agent, 5.0, 1 << 20)  # past the agent's warm-up
        _burst(agent, 1000)
        assert httpx.get(agent.url + "/healthz", timeout=1.0).status_code == 200
        ok = 'kcops_probe_frames_total{outcome="ok"}'
        wait_until(lambda: _metric(agent, ok) == 1000, 30, "every frame taken")
        assert _metric(agent, 'kcops_probe_connections_total{outcome="accepted"}') == 1000
        open_ = "kcops_probe_connections_open"
        wait_until(lambda: _metric(agent, open_) == 0, 30, "every stream connection closed")
        peak = agent.rss_bytes()
        # 10 s span several evictions (every EVICT_EVERY_TICKS = 10 ticks of 0.2 s here)
        after, store_after, store_low = _settled(agent, 10.0, 4 << 20)
        store_grew = store_after - store_before
        print(
            f"RSS MiB: before {before / 2**20:.1f}, after the burst {peak / 2**20:.1f}, "
            f"settled {after / 2**20:.1f}, of which the store's growth "
            f"{store_grew / 2**20:.1f}: {(after - store_grew) / before - 1:+.1%} without it"
        )
        # the store is held to its budget: back under it at each eviction (between two
        # it may overshoot by the samples of those ticks: 68 MiB was seen once)
        assert store_low <= 64 << 20, (store_low, store_after)
        # The acceptance line: within 10%, or the growth within the store's budget. The
        # two parts apart: the store within its budget (above), and the rest (the probe's
        # state of 1,000 processes, kept until idle_s, and allocator fragmentation) back
        # within 25% of before. The old single bound, growth <= 64 MiB, mixed them and
        # sat at its edge: the rest measured +8% to +17% over six runs, the store 52-62 MiB,
        # so the sum crossed 64 MiB now and then with nothing growing. Since the probe keeps
        # each process's last samples until its next frame (a flood's tick costs half: bench/
        # flood_tick.py), the rest holds those of its 32 slots too: +14.7% measured alone,
        # +25.8% and +31.1% inside make test's two workers (2026-12-06), so the bound is 40%.
        # A leak of the connections' buffers (up to 64 KiB each, 1,000 of them: 64 MiB,
        # +100% of before) is still far over it.
        assert after - store_grew <= before * 1.40, (after, store_grew, before)
    finally:
        stop_agent(agent)


def test_a_remembered_nvml_failure_does_not_grow_its_traceback() -> None:
    from kcops.agent.collectors.nvml import Nvml, NvmlUnavailable

    def no_driver() -> object:
        raise ImportError("no pynvml")

    nvml = Nvml(loader=no_driver)
    depths = []
    for _ in range(20):
        try:
            nvml.init()
        except NvmlUnavailable as exc:
            tb, n = exc.__traceback__, 0
            while tb is not None:
                tb, n = tb.tb_next, n + 1
            depths.append(n)
    assert max(depths) <= depths[1] + 1  # the same depth every tick, not one frame more each
