"""Per-source series budgets (issue 33, item 2): one source never starves another."""

from __future__ import annotations

import logging

import pytest

from kcops.agent.quotas import MAX_SOURCES, OTHER, Quotas, probe_source
from kcops.agent.samples import Sample, SeriesKey
from kcops.agent.store import Store


def _samples(source: str, n: int) -> list[Sample]:
    return [Sample.of("m", 1.0, {"src": source, "i": str(i)}) for i in range(n)]


def test_a_source_over_its_budget_loses_only_its_own_new_series(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = Store(max_series=1000, max_series_per_source=10)
    with caplog.at_level(logging.WARNING, "kcops.agent.store"):
        for t in range(3):
            assert store.add(_samples("flood", 50), float(t), "flood") == 10
    assert store.add(_samples("good", 5), 3.0, "good") == 5
    assert store.quotas.refused == {"flood": 3 * 40}
    assert store.over_budget == 120
    warned = [r for r in caplog.records if "flood" in r.getMessage()]
    assert len(warned) == 1, "a source over its budget is named once, not each tick"


def test_a_full_store_admits_a_new_source_in_place_of_the_largest() -> None:
    store = Store(max_series=100, max_series_per_source=1000)
    store.add(_samples("flood", 100), 0.0, "flood")
    assert len(store) == 100
    assert store.add(_samples("engine", 5), 1.0, "engine") == 5
    assert len(store) == 100
    assert store.quotas.count("engine") == 5
    assert store.quotas.count("flood") == 95
    # The flood cannot take its series back: it holds more than its share.
    assert store.add(_samples("flood", 100), 2.0, "flood") == 95
    assert store.quotas.count("engine") == 5
    assert store.quotas.refused["flood"] == 5


def test_a_source_gone_quiet_frees_its_series_for_others() -> None:
    store = Store(max_series=100, max_series_per_source=60, quiet_after_s=30.0)
    store.add(_samples("a", 60), 0.0, "a")
    assert store.add(_samples("a", 61), 1.0, "a") == 60  # over its budget
    store.evict(40.0)  # "a" wrote nothing for 39 s
    assert store.quotas.count("a") == 0
    assert store.add(_samples("b", 60), 41.0, "b") == 60
    assert len(store) == 100  # 20 of "a"'s quiet series made room for "b"
    # A quiet source that writes again counts again.
    store.add(_samples("a", 1), 42.0, "a")
    store.evict(43.0)
    assert store.quotas.count("a") == 1


def test_the_store_names_the_source_by_labels_when_asked() -> None:
    store = Store(max_series=1000, max_series_per_source=3)
    samples = [
        Sample.of(
            "kcops_attention_calls_total", 1.0, {"engine": "e", "layer": str(i), "process": p}
        )
        for p in ("p1", "p2")
        for i in range(5)
    ]
    assert store.add(samples, 0.0, probe_source) == 6
    assert store.quotas.refused == {"probe:e/p1": 2, "probe:e/p2": 2}
    assert probe_source((("outcome", "ok"),)) == "probe"


def test_refusals_name_a_bounded_number_of_sources() -> None:
    q = Quotas(per_source=1)
    for i in range(MAX_SOURCES + 50):
        q.refuse(f"s{i}", "test")
    assert len(q.refused) == MAX_SOURCES + 1
    assert q.refused[OTHER] == 50


def test_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="per_source must be >= 1"):
        Quotas(per_source=0)


def test_a_removed_series_leaves_no_trace() -> None:
    store = Store(retention_s=10.0, max_series=10, max_series_per_source=10)
    store.add(_samples("a", 3), 0.0, "a")
    store.evict(100.0)
    assert len(store) == 0
    assert store.quotas.source_of == {} and store.quotas.keys == {}
    assert not store.quotas.quiet_keys
    assert SeriesKey("m", (("i", "0"), ("src", "a"))) not in store.quotas.source_of


class _Scrape:
    """A scrape target whose exposition grows without bound (a label per request id)."""

    name = "engine_scrape"

    def __init__(self) -> None:
        self.n = 0

    def collect(self, now: float) -> list[Sample]:
        self.n += 500
        return [Sample.of("vllm:req", 1.0, {"id": str(i)}) for i in range(self.n)]


class _Own:
    name = "self"

    def collect(self, now: float) -> list[Sample]:
        return [Sample.of("kcops_store_bytes", now)]


def test_a_scrape_target_over_its_budget_does_not_starve_the_agents_own_series() -> None:
    import asyncio

    from kcops.agent.collectors.base import CollectorRunner

    store = Store(max_series=2000, max_series_per_source=1000)
    runner = CollectorRunner(store, [_Scrape(), _Own()])
    for t in range(1, 6):
        asyncio.run(runner.tick(float(t)))
    assert store.quotas.count("engine_scrape") == 1000
    assert store.latest(SeriesKey.of("kcops_store_bytes")) == (5.0, 5.0)
    # 500, 1,000, ... 2,500 samples a tick; 1,000 series admitted; the rest counted
    assert store.quotas.refused["engine_scrape"] == 500 + 1000 + 1500
    assert "self" not in store.quotas.refused
