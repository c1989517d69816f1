"""Hostile probe datagrams: fuzzed frames never raise anything but WireError, never reach the
store out of range, and a burst from 1,000 processes leaves memory bounded."""

from __future__ import annotations

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
from kcops.kernels.wire_json import encode_v1
from tests.faults.conftest import RealAgent, start_agent, stop_agent
from tests.unit.kernels.test_wire import as_v2, sample_frame

GOOD = wire.encode(sample_frame())


def _check(frame: wire.Frame) -> None:
    """What a decoded frame guarantees the receiver and the store."""
    for v in (*frame.calls_by_layer.values(), *frame.errors.values(), frame.dropped_total):
        assert 0 <= v <= wire.MAX_COUNT
    for h in (*frame.histograms.values(), *frame.topn_mass.values()):
        assert math.isfinite(h.sum) and 0 <= h.sum <= wire.MAX_SUM
        assert len(h.counts) == len(h.bounds) + 1 and min(h.counts) >= 0
    labels = [frame.process, frame.instance, *frame.calls_by_layer]
    assert all(len(x) <= wire.MAX_LABEL_CHARS for x in labels)
    assert wire.check_engine(frame.engine) == frame.engine
    assert len(frame.calls_by_layer) <= wire.MAX_LAYERS and len(frame.topn_mass) <= wire.MAX_TOPN


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_mutated_frames_decode_in_bounds_or_raise_wire_error(data: st.DataObject) -> None:
    base = bytearray(data.draw(st.sampled_from([GOOD, as_v2(GOOD), encode_v1(sample_frame())])))
    for _ in range(data.draw(st.integers(1, 8))):
        i = data.draw(st.integers(0, len(base) - 1))
        base[i] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        base = base[: data.draw(st.integers(0, len(base)))]
    try:
        frame = wire.decode(bytes(base))
    except wire.WireError:
        return
    _check(frame)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_payloads_behind_a_valid_header(payload: bytes) -> None:
    for version in (wire.VERSION, wire.VERSION_V2, wire.VERSION_JSON):
        try:
            _check(wire.decode(wire.HEADER.pack(wire.MAGIC, version, len(payload)) + payload))
        except wire.WireError:
            pass


def _v1(body: bytes) -> bytes:
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION_JSON, len(body)) + body


HOSTILE_V1 = [
    b'{"pid": ' + b"1" * 5000 + b', "seq": 0}',  # past Python's 4,300-digit int limit
    b'{"pid": 1, "seq": 0, "ts": ' + b"7" * 4400 + b"}",
    b'{"pid": 1, "seq": 0, "hist": {"kcops_kc_tokens": {"c": [0], "s": 1, "n": 0}}}',
    b'{"pid": 1, "seq": 0, "hist": {"kcops_kc_ratio": {"c": ['
    + b",".join([b"0"] * 20)
    + b'], "s": 1'
    + b"0" * 400
    + b', "n": 0}}}',  # an integer sum past 1e308: float() of it raises OverflowError
    b'{"pid": 1, "seq": 0, "process": "\\ud800"}',  # a lone surrogate
    b'{"pid": 1, "seq": 0, "instance": "a\\udfff"}',
    b'{"pid": 1, "seq": 0, "calls": {"\\ud83d": 1}}',  # half of an emoji's pair, as a layer
    b'{"pid": 1, "seq": 0, "ts": NaN}',
    b'{"pid": 1, "seq": 0, "ts": -Infinity}',
    b'{"pid": 1, "seq": 0, "errors": {"\\ud800": 1}}',
    b'{"pid": 1, "seq": 0, "topn": {"\\ud800": {}}}',
    b"[" * 100_000,
]


@pytest.mark.parametrize("body", HOSTILE_V1, ids=range(len(HOSTILE_V1)))
def test_hostile_v1_bodies_are_wire_errors(body: bytes, caplog: pytest.LogCaptureFixture) -> None:
    """Each is a WireError (counted malformed, one line), never another exception."""
    with pytest.raises(wire.WireError):
        wire.decode(_v1(body))
    r = ProbeReceiver("/nonexistent/probe.sock")
    r.feed(_v1(body))
    assert r.frames["malformed"] == 1
    assert "Traceback" not in caplog.text and "decoder bug" not in caplog.text


def test_a_label_utf8_cannot_encode_never_fails_the_metrics_page() -> None:
    """Defence in depth behind the decoders: the exporter escapes it, in both formats and
    in OTLP, instead of failing every scrape."""
    from kcops.agent.exporter import build_registry, render
    from kcops.agent.otlp_metrics import build_request
    from kcops.agent.samples import Sample
    from kcops.agent.signals import register_all
    from kcops.agent.store import Store

    store = Store()
    register_all(store)
    bad = (("engine", "x"), ("layer", "0"), ("process", "a\ud800b"))
    store.add([Sample("kcops_attention_calls_total", bad, 3.0)], 100.0)
    store.add([Sample("kcops_probe_frames_total", (("outcome", "ok"),), 2.0)], 100.0)
    registry = build_registry(store, lambda: 100.0, 30.0)
    for accept in (None, "application/openmetrics-text; version=1.0.0"):
        body, _ = render(registry, accept)
        text = body.decode()
        assert 'process="a\\\\ud800b"} 3.0' in text, text
        assert 'kcops_probe_frames_total{outcome="ok"} 2.0' in text
    req = build_request(store, 100.0, started_at=0.0, stale_after_s=30.0, service_name="t")
    assert b"a\\ud800b" in req.SerializeToString()


def test_one_bad_frame_never_disables_the_receiver() -> None:
    r = ProbeReceiver("/nonexistent/probe.sock")
    huge = encode_v1(sample_frame()).replace(b'"0":3', b'"0":' + b"9" * 400)
    for bad in (huge, GOOD[:-8] + struct.pack(">d", math.nan), b"KCPF\x00\x02" + b"\xff" * 60):
        r.feed(bad)
    r.feed(GOOD)
    for _ in range(3):
        out = r.collect(0.0)
        assert all(math.isfinite(s.value) for s in out)
    assert r.frames["ok"] == 1 and r.frames["malformed"] == 3


def _burst(agent: RealAgent, processes: int) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        for i in range(processes):
            f = sample_frame()
            f.pid, f.process, f.instance = 10_000 + i, f"proc-{i}", f"inst-{i}"
            f.calls_by_layer = {str(layer): 3 for layer in range(30)}
            data = wire.encode(f)
            for _ in range(50):
                try:
                    s.sendto(data, str(agent.probe_socket))
                    break
                except BlockingIOError:
                    time.sleep(0.001)
    finally:
        s.close()


def _store_bytes(agent: RealAgent) -> int:
    """The store's own estimate of what it holds, from the agent's /metrics."""
    for line in httpx.get(agent.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith("kcops_store_bytes "):
            return int(float(line.split()[1]))
    raise AssertionError("no kcops_store_bytes on /metrics")


@pytest.mark.slow
def test_burst_from_1000_processes_then_rss_returns(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """RSS a minute after a burst is within 10% of before, or grew within the store budget."""
    agent = start_agent(tmp_path_factory.mktemp("burst"), extra={"store": {"max_bytes": 64 << 20}})
    try:
        time.sleep(10)  # the agent's own warm-up allocations (a condition would be a guess)
        before, store_before = agent.rss_bytes(), _store_bytes(agent)
        _burst(agent, 1000)
        assert httpx.get(agent.url + "/healthz", timeout=1.0).status_code == 200
        peak = agent.rss_bytes()
        time.sleep(60)
        after, store_grew = agent.rss_bytes(), _store_bytes(agent) - store_before
        print(
            f"RSS MiB: before {before / 2**20:.1f}, after the burst {peak / 2**20:.1f}, "
            f"a minute later {after / 2**20:.1f}, of which the store's growth "
            f"{store_grew / 2**20:.1f}: {(after - store_grew) / before - 1:+.1%} without it"
        )
        assert store_grew <= 64 << 20  # the store stayed within its budget
        # The acceptance line: within 10%, or the growth within the store's budget. Set
        # against the store's own estimate the rest was +17.5% with 1,000 cached probe
        # shapes (since bounded); the estimate undercounts per-series overhead, so it is
        # printed, not asserted (docs/benchmarks.md).
        assert after <= before * 1.10 or after - before <= 64 << 20
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
