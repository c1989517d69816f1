"""The exporter publishes the store's newest values under catalogue types."""

from __future__ import annotations

from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families

from kcops.agent.exporter import StoreExporter, render
from kcops.agent.samples import Sample, SeriesKey
from kcops.agent.signals import register_all
from kcops.agent.store import Store
from tests.clock import ManualClock


def make() -> tuple[Store, ManualClock]:
    st = Store()
    register_all(st)
    return st, ManualClock(1000.0)


def registry(st: Store, clock: ManualClock) -> StoreExporter:
    return StoreExporter(st, clock, stale_after_s=30)


def families(body: bytes) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def test_counter_gauge_histogram_types_and_values() -> None:
    st, clock = make()
    st.add(
        [
            Sample.of("kcops_attention_calls_total", 12, {"layer": "0"}),
            Sample.of("kcops_kv_cache_usage_ratio", 0.25, {"engine": "kcops"}),
            Sample.of("kcops_agent_tick_seconds_bucket", 1, {"le": "0.01"}),
            Sample.of("kcops_agent_tick_seconds_bucket", 2, {"le": "+Inf"}),
            Sample.of("kcops_agent_tick_seconds_sum", 0.5),
            Sample.of("kcops_agent_tick_seconds_count", 2),
        ],
        now=clock(),
    )
    reg = registry(st, clock)
    body, ctype = render(reg, None)
    assert ctype.startswith("text/plain")
    fams = families(body)
    calls = fams["kcops_attention_calls"]
    assert calls.type == "counter"  # type: ignore[attr-defined]
    assert calls.samples[0].value == 12 and calls.samples[0].labels == {"layer": "0"}  # type: ignore[attr-defined]
    assert fams["kcops_kv_cache_usage_ratio"].type == "gauge"  # type: ignore[attr-defined]
    hist = fams["kcops_agent_tick_seconds"]
    assert hist.type == "histogram"  # type: ignore[attr-defined]
    assert {s.name for s in hist.samples} == {  # type: ignore[attr-defined]
        "kcops_agent_tick_seconds_bucket",
        "kcops_agent_tick_seconds_sum",
        "kcops_agent_tick_seconds_count",
    }


def test_openmetrics_negotiation() -> None:
    st, clock = make()
    st.add([Sample.of("kcops_engine_up", 1)], now=clock())
    body, ctype = render(registry(st, clock), "application/openmetrics-text")
    assert ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")


def test_stale_and_old_series_are_absent_not_zero() -> None:
    st, clock = make()
    st.add([Sample.of("kcops_engine_up", 1), Sample.of("kcops_requests_running", 3)], now=clock())
    st.mark_stale(SeriesKey.of("kcops_engine_up"), clock() + 1)
    clock.advance(1)
    body, _ = render(registry(st, clock), None)
    assert b"kcops_engine_up" not in body.replace(b"# HELP", b"").replace(b"# TYPE", b"")
    assert b"kcops_requests_running 3.0" in body
    clock.advance(60)
    body, _ = render(registry(st, clock), None)
    assert b"kcops_requests_running 3.0" not in body


def test_unknown_family_is_untyped() -> None:
    st, clock = make()
    st.add([Sample.of("my_custom_metric", 5)], now=clock())
    body, _ = render(registry(st, clock), None)
    assert b"# TYPE my_custom_metric untyped" in body


def test_histogram_buckets_in_numeric_order_per_label_set() -> None:
    """OpenMetrics wants each label set's buckets together, ``le`` ascending, ``+Inf`` last:
    the strings' order (``+Inf`` < ``0.5`` < ``10`` < ``2``) is refused by its parser."""
    st, clock = make()
    rows: list[Sample] = []
    for engine, n in (("b", 4), ("a", 3)):
        lab = {"engine": engine}
        for le, v in (("+Inf", n), ("10", n), ("2", n - 1), ("0.5", 1)):
            rows.append(Sample.of("kcops_request_latency_seconds_bucket", v, {**lab, "le": le}))
        rows.append(Sample.of("kcops_request_latency_seconds_sum", 7.5, lab))
        rows.append(Sample.of("kcops_request_latency_seconds_count", n, lab))
    st.add(rows, now=clock())
    body, _ = render(registry(st, clock), "application/openmetrics-text; version=1.0.0")
    fams = {f.name: f for f in om_families(body.decode())}
    hist = fams["kcops_request_latency_seconds"]
    les = [(s.labels["engine"], s.labels["le"]) for s in hist.samples if s.name.endswith("_bucket")]
    assert les == [(e, le) for e in "ab" for le in ("0.5", "2", "10", "+Inf")]
    text, _ = render(registry(st, clock), None)
    assert text.index(b'le="10"') < text.index(b'le="+Inf"')
