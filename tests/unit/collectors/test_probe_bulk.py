"""The receiver's bulk path (probe_bulk) against the long way (wire.decode + add), fed
single frames and streams cut at every kind of place.

Both receivers get the same bytes; their outcomes and samples must agree (histogram sums
up to float rounding: the bulk path adds them in another order).
"""

from __future__ import annotations

import math
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from kcops.agent.collectors import probe_bulk
from kcops.agent.collectors.probe import ProbeReceiver
from kcops.agent.samples import Sample
from kcops.kernels import wire

MAX_U32 = 2**32 - 1
names = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"),
    min_size=1,
    max_size=wire.MAX_LABEL_CHARS,
)
counts = st.integers(0, MAX_U32)


def as_dict(samples: list[Sample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels))): s.value for s in samples}


def mutated(good: bytes, data: st.DataObject) -> bytes:
    """``good`` with 1 to 6 bytes overwritten and, half the time, cut short."""
    bad = bytearray(good)
    for _ in range(data.draw(st.integers(1, 6))):
        bad[data.draw(st.integers(0, len(bad) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        bad = bad[: data.draw(st.integers(0, len(bad)))]
    return bytes(bad)


def receivers() -> tuple[ProbeReceiver, ProbeReceiver]:
    fast = ProbeReceiver("/nonexistent/probe.sock", max_frames_per_s=10**9)
    slow = ProbeReceiver("/nonexistent/probe.sock", max_frames_per_s=10**9)
    slow._bulk = False
    return fast, slow


def assert_same(fast: ProbeReceiver, slow: ProbeReceiver) -> None:
    assert fast.frames == slow.frames and fast.refused == slow.refused
    a, b = as_dict(fast.collect(0.0)), as_dict(slow.collect(0.0))
    assert a.keys() == b.keys()
    for key, v in a.items():
        # float sums (the priced tokens are exported as their histogram's sum, a counter)
        if key[0].endswith("_sum") or key[0] == "kcops_request_priced_effective_tokens_total":
            assert math.isclose(v, b[key], rel_tol=1e-9, abs_tol=1e-9), key
        else:
            assert v == b[key], key


def hist(name: str, draw: st.DrawFn, top: float = 1e18) -> wire.Histogram:
    n = len(wire.BUCKETS[name]) + 1
    return wire.Histogram(
        wire.BUCKETS[name], draw(st.lists(counts, min_size=n, max_size=n)),
        draw(st.one_of(st.floats(0.0, 100.0), st.floats(0.0, top))),
    )  # fmt: skip


@st.composite
def frames(draw: st.DrawFn) -> wire.Frame:
    plain = draw(st.lists(st.sampled_from(wire.PLAIN_HISTOGRAMS), unique=True))
    calls = draw(st.dictionaries(names, counts, max_size=5))
    kc_names = draw(st.lists(st.sampled_from([*calls, "x", "unknown"]), unique=True, max_size=4))
    return wire.Frame(
        pid=draw(st.integers(0, MAX_U32)),
        process=draw(st.sampled_from(["engine", "worker", ""])),
        seq=draw(st.integers(0, 2**64 - 1)),
        instance=draw(st.sampled_from(["a", "b"])),
        ts=draw(st.one_of(st.floats(0.0, 2e9), st.floats(0.0, wire.MAX_TS))),
        calls_by_layer=calls,
        errors={k: draw(counts) for k in wire.ERROR_KINDS},
        histograms={name: hist(name, draw) for name in plain},
        topn_mass={
            k: hist(wire.TOPN_MASS, draw)
            for k in draw(st.lists(st.integers(1, wire.MAX_TOPN_N), unique=True, max_size=3))
        },
        engine=draw(st.sampled_from(["unknown", "vllm", "kcops"])),
        kc_by_layer={n: hist(wire.KC_TOKENS, draw) for n in kc_names},
        internal_errors=draw(counts),
        dropped=draw(counts),
    )


def feed_stream(r: ProbeReceiver, data: bytes, cuts: list[int]) -> int:
    """``data`` as a connection delivers it, in reads ending at ``cuts``; returns the bytes
    left unconsumed at the end (an unfinished frame), or -1 if the stream went out of step."""
    rest = b""
    prev = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        buf = rest + data[prev:cut]
        prev = cut
        took = r._consume(buf)
        if took < 0:
            return -1
        rest = buf[took:]
    return len(rest)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(frames(), min_size=1, max_size=4),
    st.lists(st.integers(0, 3), max_size=12),
    st.data(),
)
def test_the_bulk_path_sums_what_the_long_way_sums(
    fs: list[wire.Frame], order: list[int], data: st.DataObject
) -> None:
    fast, slow = receivers()
    encoded = [wire.encode(f) for f in fs]
    stream = b"".join(encoded[i % len(encoded)] for i in [*range(len(fs)), *order])
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6))
    assert feed_stream(fast, stream, cuts) == 0
    assert feed_stream(slow, stream, []) == 0
    assert_same(fast, slow)
    assert slow.bulked == 0
    # and one frame at a time
    for d in encoded:
        fast.feed(d)
        slow.feed(d)
    assert_same(fast, slow)


@settings(max_examples=150, deadline=None)
@given(frames(), st.data())
def test_mutated_frames_get_the_same_verdict_both_ways(f: wire.Frame, data: st.DataObject) -> None:
    fast, slow = receivers()
    good = wire.encode(f)
    bad = mutated(good, data)
    for r in (fast, slow):
        r.feed(good)  # the shape is cached now: the mutated frame must not ride on it
        r.feed(bad)
    assert_same(fast, slow)


def test_counters_at_the_u32_limit_do_not_carry_into_their_neighbours() -> None:
    fast, slow = receivers()
    h = wire.Histogram(wire.BUCKETS[wire.KC_TOKENS], [MAX_U32] * 28, 1e12)
    f = wire.Frame(
        pid=1, process="p", seq=0, calls_by_layer={"a": MAX_U32, "b": 1, "c": MAX_U32},
        errors={"nan": MAX_U32, "inf": 0, "exception": MAX_U32},
        kc_by_layer={"b": h}, internal_errors=MAX_U32, dropped=1,
    )  # fmt: skip
    stream = wire.encode(f) * 7
    assert feed_stream(fast, stream, []) == 0
    assert feed_stream(slow, stream, []) == 0
    assert_same(fast, slow)
    assert fast.bulked == 6  # the first frame taught the shape, the other six rode on it
    out = as_dict(fast.collect(0.0))
    lbl = ("engine", "unknown")
    calls = "kcops_attention_calls_total"
    assert out[(calls, (lbl, ("layer", "a"), ("process", "p")))] == 7 * MAX_U32
    assert out[(calls, (lbl, ("layer", "b"), ("process", "p")))] == 7
    assert out[("kcops_probe_dropped_total", (lbl, ("process", "p")))] == 7
    kc = ("kcops_kc_tokens_bucket", (lbl, ("layer", "b"), ("le", "1.0"), ("process", "p")))
    assert out[kc] == 7 * MAX_U32


def test_a_batch_the_bulk_check_cannot_vouch_for_goes_frame_by_frame() -> None:
    """A sum over 2**49 is valid (up to 1e18) but outside the bulk check; a NaN is not
    valid: either way the batch is decoded one frame at a time, the bad one refused."""
    fast, slow = receivers()
    ok = wire.Frame(pid=1, process="p", seq=0, ts=1e9, calls_by_layer={"0": 1})
    ok.histograms = {wire.KC_RATIO: wire.Histogram.of(wire.KC_RATIO)}
    big = wire.Frame(**{**ok.__dict__, "histograms": {wire.KC_RATIO: wire.Histogram(
        wire.BUCKETS[wire.KC_RATIO], [1] * 20, 1e17)}})  # fmt: skip
    late = wire.Frame(**{**ok.__dict__, "ts": 9e10})  # valid, after the year 2242
    good, huge, later = wire.encode(ok), wire.encode(big), wire.encode(late)
    nan = bytearray(good)
    struct.pack_into(">d", nan, len(nan) - 8, math.nan)  # the last float: the sum
    stream = good * 3 + huge + good + bytes(nan) + later + good
    for r in (fast, slow):
        assert feed_stream(r, stream, []) == 0
    assert fast.frames["ok"] == 7 and fast.frames["malformed"] == 1
    assert_same(fast, slow)
    assert fast.bulked == 0  # one batch: every frame went the long way


def test_a_stream_out_of_step_is_refused_and_says_so() -> None:
    r, _ = receivers()
    good = wire.encode(wire.Frame(pid=1, process="p", seq=0, calls_by_layer={"0": 1}))
    assert feed_stream(r, good * 2 + b"garbage that is no header" + good, []) == -1
    assert r.frames["ok"] == 2 and r.frames["malformed"] == 1
    assert r.refused == {"bad_magic": 1}
    too_long = wire.HEADER.pack(wire.MAGIC, wire.VERSION, wire.MAX_FRAME_BYTES)
    assert feed_stream(r, good + too_long, []) == -1
    assert r.refused == {"bad_magic": 1, "too_large": 1}


def test_a_burst_of_distinct_processes_leaves_a_bounded_shape_cache() -> None:
    fast, _ = receivers()
    for i in range(1000):
        fast.feed(wire.encode(wire.Frame(pid=i, process=f"p{i}", seq=0, calls_by_layer={"0": 1})))
    assert fast.frames["ok"] == 1000
    assert len(fast._shapes) <= fast._shapes.max_shapes <= 4 * 32


def test_the_lane_split_reads_back_every_lane() -> None:
    for lanes in (1, 2, 3, 8, 165):
        values = [(i * 2654435761) % (MAX_U32 + 1) for i in range(lanes)]
        block = int.from_bytes(struct.pack(f">{lanes}I", *values), "big")
        mask = probe_bulk.lane_mask(lanes)
        a = b = 0
        for _ in range(3):
            a += block
            b += block & mask
        assert probe_bulk.lanes_of(a, b, lanes) == [3 * v for v in values]
