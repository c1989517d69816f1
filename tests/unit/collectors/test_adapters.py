from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kcops.agent.collectors import promtext
from kcops.agent.engine.kinds import builtin_kinds
from kcops.agent.engine.kinds.vllm import ADAPTER as VLLM
from kcops.agent.samples import SeriesKey
from tests.unit.collectors.helpers import by_key, names, value

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def _full_parse(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_vllm_fixture_maps_every_canonical_series_with_same_values_and_buckets() -> None:
    text = (FIXTURES / "vllm_metrics.txt").read_text()
    raw = _full_parse(text)
    mapped = by_key(VLLM.map(promtext.parse(text, VLLM.wanted())))
    expected = 0
    for m in VLLM.maps:
        src = next(
            (s for s in m.sources if any(n.startswith(s + "_") or n == s for n in raw)), None
        )
        if src is None:
            continue
        suffixes = {
            "gauge": [""],
            "counter": ["_total"],
            "histogram": ["_bucket", "_sum", "_count"],
            "count": ["_count"],  # a histogram's count as a counter: <target>_total
        }
        for suf in suffixes[m.kind]:
            for s in raw.get(src + suf, []):
                labels = {("engine_index" if k == "engine" else k): v for k, v in s.labels.items()}
                name = m.target + ("_total" if m.kind == "count" else suf)
                want = s.value
                if m.value_label is not None:  # an info gauge's field: its value, no labels
                    want = float(labels[m.value_label])
                    labels = {"engine_index": labels["engine_index"]}
                key = SeriesKey.of(name, {**labels, "engine": "vllm"})
                assert mapped.get(key) == want, key
                expected += 1
    assert expected == len(mapped)
    got = {k.name for k in mapped}
    # every canonical family vLLM provides is there
    for fam in (
        "kcops_request_latency_seconds_bucket",
        "kcops_ttft_seconds_bucket",
        "kcops_inter_token_latency_seconds_count",
        "kcops_kv_cache_usage_ratio",
        "kcops_requests_waiting",
        "kcops_requests_running",
        "kcops_prefix_cache_queries_total",
        "kcops_prefix_cache_hits_total",
        "kcops_generation_tokens_total",
        "kcops_prompt_tokens_total",
        "kcops_engine_iterations_total",
    ):
        assert fam in got, fam
    # buckets kept as vLLM formats them
    les = sorted(
        (dict(k.labels)["le"] for k in mapped if k.name == "kcops_request_latency_seconds_bucket"),
        key=lambda x: float(x),
    )
    assert les[:3] == ["0.3", "0.5", "0.8"] and les[-1] == "+Inf" and len(les) == 22
    assert (
        value(
            mapped_samples(text),
            "kcops_kv_cache_usage_ratio",
            engine="vllm",
            engine_index="0",
            model_name="SmolLM2-135M-Instruct",
        )
        == 0.0421875
    )


def mapped_samples(text: str):  # type: ignore[no-untyped-def]
    return VLLM.map(promtext.parse(text, VLLM.wanted()))


def test_vllm_deprecated_names_map_when_that_is_what_the_version_exposes() -> None:
    text = (FIXTURES / "vllm_metrics_v0_8.txt").read_text()
    out = mapped_samples(text)
    lab = {"engine": "vllm", "engine_index": "0", "model_name": "m"}
    assert value(out, "kcops_kv_cache_usage_ratio", **lab) == 0.25
    assert value(out, "kcops_prefix_cache_queries_total", **lab) == 40
    assert value(out, "kcops_prefix_cache_hits_total", **lab) == 30
    assert value(out, "kcops_inter_token_latency_seconds_bucket", le="0.05", **lab) == 9
    assert value(out, "kcops_inter_token_latency_seconds_sum", **lab) == 0.31


def test_current_name_wins_over_deprecated_when_both_exist() -> None:
    text = (
        'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.9\n'
    )
    out = mapped_samples(text)
    assert [s.value for s in out if s.name == "kcops_kv_cache_usage_ratio"] == [0.5]


def test_detect() -> None:
    vllm_text = (FIXTURES / "vllm_metrics.txt").read_text()
    assert builtin_kinds().detect(promtext.metric_names(vllm_text)).name == "vllm"
    kc = vllm_text + "# TYPE kcops_worker_attention_topn gauge\nkcops_worker_attention_topn 64\n"
    assert builtin_kinds().detect(promtext.metric_names(kc)).name == "kcops"
    assert builtin_kinds().detect({"sglang:num_queue_reqs"}).name == "sglang"
    assert builtin_kinds().detect({"tgi_queue_size"}).name == "tgi"
    assert builtin_kinds().detect({"nv_inference_pending_request_count"}).name == "triton"
    assert builtin_kinds().detect({"python_gc_objects_collected"}) is None
    with pytest.raises(ValueError, match="allowed"):
        builtin_kinds().get("ollama")


def test_kcops_worker_names_map_to_canonical() -> None:
    text = """# TYPE kcops_worker_segment_transfer_seconds histogram
kcops_worker_segment_transfer_seconds_bucket{le="0.01"} 3.0
kcops_worker_segment_transfer_seconds_bucket{le="+Inf"} 4.0
kcops_worker_segment_transfer_seconds_sum 0.2
kcops_worker_segment_transfer_seconds_count 4.0
# TYPE kcops_worker_attention_topn gauge
kcops_worker_attention_topn 64.0
# TYPE kcops_worker_route_fallback gauge
kcops_worker_route_fallback 0.0
# TYPE kcops_worker_shadow_agreement_ratio gauge
kcops_worker_shadow_agreement_ratio 0.97
# TYPE kcops_worker_shadow_checks_total counter
kcops_worker_shadow_checks_total 120.0
# TYPE kcops_worker_kv_bytes gauge
kcops_worker_kv_bytes{model_name="tiny"} 1.2288e+06
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="tiny"} 1.0
"""
    a = builtin_kinds().get("kcops").adapter
    out = a.map(promtext.parse(text, a.wanted()))
    assert value(out, "kcops_segment_transfer_seconds_bucket", engine="kcops", le="0.01") == 3
    assert value(out, "kcops_segment_transfer_seconds_count", engine="kcops") == 4
    assert value(out, "kcops_attention_topn", engine="kcops") == 64
    assert value(out, "kcops_route_fallback", engine="kcops") == 0
    assert value(out, "kcops_shadow_agreement_ratio", engine="kcops") == 0.97
    assert value(out, "kcops_shadow_checks_total", engine="kcops") == 120
    assert value(out, "kcops_kv_cache_bytes", engine="kcops", model_name="tiny") == 1228800
    assert value(out, "kcops_requests_running", engine="kcops", model_name="tiny") == 1


def test_sglang_and_tgi_absent_series_stay_absent() -> None:
    sg = """# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 3.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.4
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="m"} 10.0
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 30.0
"""
    a = builtin_kinds().get("sglang").adapter
    out = a.map(promtext.parse(sg, a.wanted()))
    assert value(out, "kcops_requests_waiting", engine="sglang", model_name="m") == 3
    assert value(out, "kcops_kv_cache_usage_ratio", engine="sglang", model_name="m") == 0.4
    assert value(out, "kcops_prefix_cache_hits_total", engine="sglang", model_name="m") == 10
    assert value(out, "kcops_prefix_cache_queries_total", engine="sglang", model_name="m") == 30
    assert "kcops_ttft_seconds_bucket" not in names(out)
    tgi = """# TYPE tgi_queue_size gauge
tgi_queue_size 2
# TYPE tgi_request_duration histogram
tgi_request_duration_bucket{le="0.5"} 1
tgi_request_duration_bucket{le="+Inf"} 2
tgi_request_duration_sum 1.2
tgi_request_duration_count 2
"""
    a = builtin_kinds().get("tgi").adapter
    out = a.map(promtext.parse(tgi, a.wanted()))
    assert value(out, "kcops_request_latency_seconds_bucket", engine="tgi", le="0.5") == 1
    assert value(out, "kcops_requests_waiting", engine="tgi") == 2
    assert names(out) == {
        "kcops_requests_waiting",
        "kcops_request_latency_seconds_bucket",
        "kcops_request_latency_seconds_sum",
        "kcops_request_latency_seconds_count",
    }


def test_triton_milliseconds_become_seconds() -> None:
    text = """# TYPE nv_inference_first_response_histogram_ms histogram
nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="100"} 2
nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="500"} 5
nv_inference_first_response_histogram_ms_bucket{model="m",version="1",le="+Inf"} 6
nv_inference_first_response_histogram_ms_sum{model="m",version="1"} 1500
nv_inference_first_response_histogram_ms_count{model="m",version="1"} 6
# TYPE nv_inference_pending_request_count gauge
nv_inference_pending_request_count{model="m",version="1"} 4
"""
    a = builtin_kinds().get("triton").adapter
    out = a.map(promtext.parse(text, a.wanted()))
    lab = {"engine": "triton", "model": "m", "version": "1"}
    assert value(out, "kcops_ttft_seconds_bucket", le="0.1", **lab) == 2
    assert value(out, "kcops_ttft_seconds_bucket", le="0.5", **lab) == 5
    assert value(out, "kcops_ttft_seconds_bucket", le="+Inf", **lab) == 6
    assert value(out, "kcops_ttft_seconds_sum", **lab) == pytest.approx(1.5)
    assert value(out, "kcops_ttft_seconds_count", **lab) == 6
    assert value(out, "kcops_requests_waiting", **lab) == 4
