"""The receiver's shortcut (probe_sums) against the long way (wire.decode + add), on
version-3 frames and on the version-2 frames of older probes (version 4:
test_probe_bulk.py).

Both receivers get the same datagrams; their counters, outcomes and samples must agree
(histogram sums up to float rounding: the shortcut adds them in another order).
"""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kcops.agent.collectors import probe_sums
from kcops.agent.collectors.probe import ProbeReceiver
from kcops.agent.samples import Sample
from kcops.kernels import wire, wire_v3
from kcops.kernels.wire_v3 import encode_v3
from tests.unit.kernels.test_wire import as_v2

MAX_U32 = 2**32 - 1


def receivers() -> tuple[ProbeReceiver, ProbeReceiver]:
    fast = ProbeReceiver("/nonexistent/probe.sock", max_frames_per_s=10**9)
    slow = ProbeReceiver("/nonexistent/probe.sock", max_frames_per_s=10**9)
    slow._fast = False
    assert fast._fast
    return fast, slow


def as_dict(samples: list[Sample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels))): s.value for s in samples}


def assert_same(fast: ProbeReceiver, slow: ProbeReceiver) -> None:
    assert fast.frames == slow.frames
    a, b = as_dict(fast.collect(0.0)), as_dict(slow.collect(0.0))
    assert a.keys() == b.keys()
    for key, v in a.items():
        if key[0].endswith("_sum"):
            assert math.isclose(v, b[key], rel_tol=1e-9, abs_tol=1e-9), key
        else:
            assert v == b[key], key


def test_the_shortcut_reads_the_wire_layout_it_was_written_for() -> None:
    # Fails when wire_v3's version-2 layout changes: the receiver then decodes every frame
    # the long way (correct, ~5x slower) until probe_sums is updated to the new layout.
    assert probe_sums.enabled(), (
        f"wire_v3.FIXED is {wire_v3.FIXED.format}, probe_sums reads {probe_sums.FIXED_FORMAT}"
    )


def test_counters_at_the_u32_limit_do_not_carry_into_their_neighbours() -> None:
    fast, slow = receivers()
    h = wire.Histogram(wire.BUCKETS[wire.KC_RATIO], [MAX_U32] * 20, 1e18)
    f = wire.Frame(
        pid=1,
        process="p",
        seq=0,
        calls_by_layer={"a": MAX_U32, "b": 1, "c": MAX_U32},
        histograms={wire.KC_RATIO: h},
        topn_mass={16: wire.Histogram(wire.BUCKETS[wire.TOPN_MASS], [MAX_U32] * 15, 0.5)},
    )
    data = encode_v3(f)
    for r in (fast, slow):
        for _ in range(5):
            r.feed(data)
    assert_same(fast, slow)
    out = as_dict(fast.collect(0.0))
    lbl = ("engine", "unknown")
    assert (
        out[("kcops_attention_calls_total", (lbl, ("layer", "a"), ("process", "p")))] == 5 * MAX_U32
    )
    assert out[("kcops_attention_calls_total", (lbl, ("layer", "b"), ("process", "p")))] == 5


names = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=wire.MAX_LABEL_CHARS,
)
counts = st.integers(0, MAX_U32)


@st.composite
def frames(draw: st.DrawFn) -> wire.Frame:
    hists = {}
    for name in draw(st.lists(st.sampled_from(wire.PLAIN_HISTOGRAMS), unique=True)):
        n = len(wire.BUCKETS[name]) + 1
        hists[name] = wire.Histogram(
            wire.BUCKETS[name],
            draw(st.lists(counts, min_size=n, max_size=n)),
            draw(st.floats(0.0, 1e18)),
        )
    topn = {}
    for k in draw(st.lists(st.integers(1, wire.MAX_TOPN_N), unique=True, max_size=4)):
        topn[k] = wire.Histogram(
            wire.BUCKETS[wire.TOPN_MASS], draw(st.lists(counts, min_size=15, max_size=15)), 0.25
        )
    return wire.Frame(
        pid=draw(st.integers(0, MAX_U32)),
        process=draw(st.sampled_from(["engine", "worker", ""])),
        seq=draw(st.integers(0, 2**64 - 1)),
        instance=draw(st.sampled_from(["a", "b"])),
        ts=draw(st.floats(0.0, wire.MAX_TS)),
        calls_by_layer=draw(st.dictionaries(names, counts, max_size=6)),
        errors={k: draw(counts) for k in wire.ERROR_KINDS},
        histograms=hists,
        topn_mass=topn,
        dropped_total=draw(st.integers(0, MAX_U32)),
        engine=draw(st.sampled_from(["unknown", "vllm", "kcops"])),
    )


def encoded(f: wire.Frame, v2: bool) -> bytes:
    return as_v2(encode_v3(f)) if v2 else encode_v3(f)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(frames(), st.booleans()), min_size=1, max_size=4),
    st.lists(st.integers(0, 3), max_size=12),
)
def test_the_shortcut_sums_what_the_long_way_sums(
    fs: list[tuple[wire.Frame, bool]], order: list[int]
) -> None:
    fast, slow = receivers()
    datagrams = [encoded(f, v2) for f, v2 in fs]
    for i in [*range(len(fs)), *order]:  # repeats: the shortcut's cache hits
        data = datagrams[i % len(datagrams)]
        fast.feed(data)
        slow.feed(data)
    assert_same(fast, slow)


def mutated(good: bytes, data: st.DataObject) -> bytes:
    """``good`` with 1 to 6 bytes overwritten and, half the time, cut short."""
    bad = bytearray(good)
    for _ in range(data.draw(st.integers(1, 6))):
        bad[data.draw(st.integers(0, len(bad) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        bad = bad[: data.draw(st.integers(0, len(bad)))]
    return bytes(bad)


@settings(max_examples=300, deadline=None)
@given(frames(), st.booleans(), st.data())
def test_mutated_frames_get_the_same_verdict_both_ways(
    f: wire.Frame, v2: bool, data: st.DataObject
) -> None:
    fast, slow = receivers()
    good = encoded(f, v2)
    bad = mutated(good, data)
    for r in (fast, slow):
        r.feed(good)  # the shape is cached now: the mutated frame must not ride on it
        r.feed(bad)
    assert_same(fast, slow)


def test_a_burst_of_distinct_processes_leaves_a_bounded_shape_cache() -> None:
    fast, _ = receivers()
    for i in range(1000):
        fast.feed(encode_v3(wire.Frame(pid=i, process=f"p{i}", seq=0, calls_by_layer={"0": 1})))
    assert fast.frames["ok"] == 1000
    assert len(fast._shapes) <= fast._shapes.max_shapes <= 4 * 32
