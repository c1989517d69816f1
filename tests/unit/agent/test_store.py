"""Store windows at their boundaries, retention eviction, staleness, limits."""

from __future__ import annotations

import math

import pytest

from kcops.agent.samples import STALE_NAN, Sample, SeriesKey, is_stale
from kcops.agent.store import Store

K = SeriesKey.of("kcops_x", {"a": "1"})


def filled(n: int = 10, step: float = 1.0, retention_s: float = 3600) -> Store:
    st = Store(retention_s=retention_s)
    for i in range(n):
        st.append(K, 100.0 + i * step, float(i))
    return st


def test_range_closed_includes_both_ends() -> None:
    st = filled()
    got = st.range(K, 102.0, 105.0)
    assert [t for t, _ in got] == [102.0, 103.0, 104.0, 105.0]


def test_range_left_open_excludes_start() -> None:
    st = filled()
    got = st.range(K, 102.0, 105.0, left_open=True)
    assert [t for t, _ in got] == [103.0, 104.0, 105.0]


def test_range_between_samples_and_outside() -> None:
    st = filled()
    assert [v for _, v in st.range(K, 102.5, 103.5)] == [3.0]
    assert st.range(K, 0, 99.9) == []
    assert st.range(K, 200, 300) == []
    assert st.range(SeriesKey.of("nope"), 0, 1e12) == []


def test_latest_respects_at_and_lookback() -> None:
    st = filled()
    assert st.latest(K) == (109.0, 9.0)
    assert st.latest(K, at=104.5) == (104.0, 4.0)
    assert st.latest(K, at=99.0) is None
    # Prometheus lookback: a sample exactly lookback old is out.
    assert st.latest(K, at=114.0, lookback_s=5.0) is None
    assert st.latest(K, at=113.9, lookback_s=5.0) == (109.0, 9.0)


def test_retention_evicts_old_samples_and_empty_series() -> None:
    st = filled(n=10, retention_s=60)
    other = SeriesKey.of("kcops_y")
    st.append(other, 100.0, 1.0)
    st.evict(now=165.0)  # cutoff 105: keeps 105..109
    assert [t for t, _ in st.range(K, 0, 1e9)] == [105.0, 106.0, 107.0, 108.0, 109.0]
    assert other not in st
    assert list(st.keys("kcops_y")) == []
    assert st.names() == ["kcops_x"]


def test_ring_compaction_keeps_data_correct() -> None:
    st = Store(retention_s=10)
    for i in range(1000):
        st.append(K, float(i), float(i))
        st.evict(float(i))
    got = st.range(K, 0, 1e9)
    # A sample exactly retention_s old is kept: a closed [now - 10, now] window needs it.
    assert got[0] == (989.0, 989.0) and got[-1] == (999.0, 999.0)
    assert len(got) == 11


def test_out_of_order_dropped_same_timestamp_overwrites() -> None:
    st = filled(n=3)
    assert st.append(K, 101.0, 42.0) is False
    assert st.dropped_out_of_order == 1
    assert st.append(K, 102.0, 7.0) is True
    assert st.latest(K) == (102.0, 7.0)


def test_max_series_bounds_memory() -> None:
    st = Store(max_series=2)
    assert st.append(SeriesKey.of("a"), 1, 1)
    assert st.append(SeriesKey.of("b"), 1, 1)
    assert not st.append(SeriesKey.of("c"), 1, 1)
    assert st.dropped_series == 1
    assert st.append(SeriesKey.of("a"), 2, 1)  # existing series still accepted


def test_stale_marker_makes_latest_absent_but_is_kept() -> None:
    st = filled(n=3)
    st.mark_stale(K, 103.0)
    assert st.latest(K) is None
    assert st.latest(K, at=102.5) == (102.0, 2.0)
    _, v = st.range(K, 103.0, 103.0)[0]
    assert is_stale(v)
    assert not is_stale(math.nan)
    assert math.isnan(STALE_NAN)
    st.mark_stale(K, 104.0)  # idempotent: no second marker
    assert len(st.range(K, 0, 1e9)) == 4


def test_add_uses_now_for_untimed_samples() -> None:
    st = Store()
    n = st.add([Sample.of("m", 1.0), Sample.of("m", 2.0, {"x": "y"}, ts=5.0)], now=10.0)
    assert n == 2
    assert st.latest(SeriesKey.of("m")) == (10.0, 1.0)
    assert st.latest(SeriesKey.of("m", {"x": "y"})) == (5.0, 2.0)


def test_bad_retention_is_refused() -> None:
    with pytest.raises(ValueError, match="retention_s"):
        Store(retention_s=0)


def test_byte_budget_refuses_new_series_and_evicts_oldest_samples() -> None:
    from kcops.agent.store import SAMPLE_BYTES

    s = Store(retention_s=1000.0, max_series=1_000_000, max_bytes=1 << 20)
    keys = [SeriesKey.of("m", {"i": str(i)}) for i in range(400)]
    t = 0.0
    full_at = None  # keep writing a while after the budget first filled
    while (full_at is None or t < full_at + 50) and t < 10_000:
        for k in keys:
            s.append(k, t, 1.0)
        t += 1
        s.evict(t)
        assert s.bytes_estimate <= s.max_bytes + len(keys) * SAMPLE_BYTES
        if full_at is None and s.evicted_samples > 0:
            full_at = t
    assert full_at is not None and full_at < 1000  # older samples went first, before the retention
    assert len(s) == len(keys)
    # the budget is full of old samples: a new series is refused until eviction
    for i in range(10_000):
        if not s.append(SeriesKey.of("new", {"i": str(i)}), t, 1.0):
            break
    assert s.refused_series > 0
    for k in keys:  # every series keeps its newest samples
        assert s.latest(k) == (t - 1, 1.0)


def test_bytes_estimate_returns_to_zero() -> None:
    s = Store(retention_s=60.0)
    for i in range(100):
        s.append(SeriesKey.of("m", {"i": str(i)}), 1.0, 1.0)
    assert s.bytes_estimate > 0
    s.evict(1000.0)
    assert s.bytes_estimate == 0 and len(s) == 0


def test_the_byte_estimate_counts_what_is_really_allocated() -> None:
    """Steady state with eviction: memory held (tracemalloc) never exceeds the estimate by
    more than a tenth. Before, dead prefixes stayed allocated until they outnumbered the
    live samples while the estimate counted live ones only: up to 1.9x."""
    import gc
    import tracemalloc

    labels = [(("engine", "vllm"), ("gpu", str(i)), ("model_name", "m")) for i in range(60)]
    tracemalloc.start()
    try:
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        s = Store(retention_s=200.0)
        ratios = []
        for t in range(1, 1001):
            s.add([Sample(f"kcops_m{i % 20}", lab, float(t)) for i, lab in enumerate(labels)], t)
            if t % 10 == 0:
                s.evict(float(t))
            if t > 200 and t % 40 == 0:
                gc.collect()
                ratios.append((tracemalloc.get_traced_memory()[0] - base) / s.bytes_estimate)
    finally:
        tracemalloc.stop()
    assert max(ratios) <= 1.1, [round(r, 2) for r in ratios]


def test_over_budget_the_dead_prefix_is_freed_at_once() -> None:
    s = Store(retention_s=1e6, max_bytes=1 << 20)
    keys = [SeriesKey.of("m", {"i": str(i)}) for i in range(100)]
    t = 0.0
    while s.bytes_estimate <= s.max_bytes:
        t += 1
        for k in keys:
            s.append(k, t, 1.0)
    s.evict(t)
    assert s.bytes_estimate <= s.max_bytes and s.evicted_samples > 0
    assert all(len(k) > 0 for k in map(s.range_arrays, keys, [0.0] * 100, [t] * 100))


def _contents(st: Store) -> dict[SeriesKey, list[tuple[float, object]]]:
    out: dict[SeriesKey, list[tuple[float, object]]] = {}
    for k in list(st.keys(None)):
        out[k] = [(t, "stale" if is_stale(v) else v) for t, v in st.range(k, -1e18, 1e18)]
    return out


def test_write_lands_what_append_would_and_returns_every_sample_key() -> None:
    """``write`` (the runner's path, with its own fast path) against ``append`` one
    sample at a time: the same contents, counters and byte estimate, through in-order,
    equal, older and untimed samples, new series past ``max_series``, eviction (rings
    with a dead prefix) and staleness markers. It returns the key of every sample,
    dropped ones included, as the store's own SeriesKey objects."""
    import random

    rng = random.Random(11)
    fast, ref = Store(retention_s=20, max_series=12), Store(retention_s=20, max_series=12)
    names = [("m", ()), ("m", (("a", "1"),)), ("h_bucket", (("le", "1"), ("x", "y")))]
    names += [(f"s{i}", (("k", str(i)),)) for i in range(12)]
    for now in range(1, 200):
        samples = []
        for _ in range(rng.randint(0, 25)):
            name, labels = rng.choice(names)
            ts = rng.choice([None, None, None, now - 1.0, float(now), now + 0.5, now - 30.0])
            samples.append(Sample(name, labels, rng.choice([1.0, 2, True, -0.5]), ts))
        if rng.random() < 0.1:
            gone = SeriesKey(*rng.choice(names))
            fast.mark_stale(gone, now)
            ref.mark_stale(gone, now)
        keys = fast.write(samples, float(now))
        for s in samples:
            ref.append(s.key, float(now) if s.ts is None else s.ts, s.value)
        assert keys == {s.key for s in samples}
        assert all(type(k) is SeriesKey and k.name == k[0] for k in keys)
        if now % 7 == 0:
            fast.evict(float(now))
            ref.evict(float(now))
        assert _contents(fast) == _contents(ref)
        assert fast.bytes_estimate == ref.bytes_estimate
        counters = ("dropped_out_of_order", "dropped_series", "refused_series")
        assert [getattr(fast, c) for c in counters] == [getattr(ref, c) for c in counters]
    assert fast.dropped_out_of_order and fast.dropped_series  # both paths were exercised


def test_add_counts_only_what_landed() -> None:
    st = Store(max_series=1)
    st.add([Sample("m", (), 1.0)], now=10.0)
    samples = [Sample("m", (), 2.0, ts=5.0), Sample("n", (), 1.0), Sample("m", (), 3.0)]
    assert st.add(samples, now=11.0) == 1  # older: dropped; a second series: refused
    assert st.write([Sample("n", (), 1.0)], now=12.0) == {SeriesKey.of("n")}
    assert "n" not in st.names()
