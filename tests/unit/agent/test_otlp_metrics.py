"""OTLP: a real OTLP/HTTP receiver decodes what the agent's SDK exporters send.

Metrics match /metrics; metrics and spans carry one Resource, built from the OTEL_* environment.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from kcops import __version__
from kcops.agent.samples import Sample
from tests.services import agent_in_thread


class Receiver:
    """An OTLP/HTTP endpoint: decodes each metrics and traces export request it is sent."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.traces: list[ExportTraceServiceRequest] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                protobuf = self.headers["Content-Type"] == "application/x-protobuf"
                ok = protobuf and self.path in ("/v1/metrics", "/v1/traces")
                with outer.cond:
                    if ok and self.path == "/v1/metrics":
                        req = ExportMetricsServiceRequest()
                        req.ParseFromString(body)
                        outer.requests.append(req)
                    elif ok:
                        spans = ExportTraceServiceRequest()
                        spans.ParseFromString(body)
                        outer.traces.append(spans)
                    outer.cond.notify_all()
                self.send_response(200 if ok else 400)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_for(self, n: int, timeout_s: float = 30) -> list[ExportMetricsServiceRequest]:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while len(self.requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{len(self.requests)} OTLP requests in {timeout_s}s")
                self.cond.wait(left)
            return list(self.requests)

    def wait_for_traces(self, timeout_s: float = 30) -> list[ExportTraceServiceRequest]:
        with self.cond:
            if not self.cond.wait_for(lambda: self.traces, timeout_s):
                raise AssertionError(f"no OTLP traces request in {timeout_s}s")
            return list(self.traces)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


SERVING = {"engine": "kcops", "model_name": "smollm2"}
LAYERS = ("model.layers.0.self_attn", "model.layers.1.self_attn")


def _hist(name: str, counts: tuple[int, ...], total: float, labels: dict[str, str]) -> list[Sample]:
    out = [
        Sample.of(f"{name}_bucket", n, {**labels, "le": le})
        for le, n in zip(("0.1", "0.5", "+Inf"), counts, strict=True)
    ]
    out.append(Sample.of(f"{name}_count", counts[-1], labels))
    out.append(Sample.of(f"{name}_sum", total, labels))
    return out


class Fixed:
    """Constant series of each kind, so a push and a scrape taken apart still agree."""

    name = "fixed"

    def collect(self, now: float) -> list[Sample]:
        dev = {"device": "0"}
        cpu = {"device": "cpu"}
        out = [
            Sample.of("kcops_device_memory_used_bytes", 7.5e9, dev),
            Sample.of("kcops_device_memory_total_bytes", 8e9, dev),
            # A CPU engine's "device" is its memory cgroup: not a GPU.
            Sample.of("kcops_device_memory_used_bytes", 1.5e9, cpu),
            Sample.of("kcops_device_memory_total_bytes", 2e9, cpu),
            Sample.of("kcops_kv_cache_usage_ratio", 0.25),
            Sample.of("kcops_engine_restarts_total", 3),
            Sample.of("kcops_prefix_cache_hits_total", 640, {"engine": "kcops"}),
            Sample.of("kcops_prefix_cache_queries_total", 1000, {"engine": "kcops"}),
            Sample.of("kcops_shadow_agreement_ratio", 0.875, {"engine": "kcops"}),
        ]
        out += [
            Sample.of("kcops_attention_calls_total", 12 + i, {"layer": n})
            for i, n in enumerate(LAYERS)
        ]
        out += _hist("kcops_ttft_seconds", (4, 9, 10), 2.5, SERVING)
        out += _hist("kcops_inter_token_latency_seconds", (70, 99, 100), 9.0, SERVING)
        out += _hist("kcops_request_latency_seconds", (1, 6, 10), 4.0, SERVING)
        out += _hist("kcops_kc_tokens", (0, 3, 8), 1900.0, {"layer": LAYERS[0]})
        return out


def _attrs(point: pb.NumberDataPoint | pb.HistogramDataPoint) -> dict[str, str | int]:
    return {
        kv.key: kv.value.int_value if kv.value.HasField("int_value") else kv.value.string_value
        for kv in point.attributes
    }


def _by_name(req: ExportMetricsServiceRequest) -> dict[str, pb.Metric]:
    (rm,) = req.resource_metrics
    (sm,) = rm.scope_metrics
    return {m.name: m for m in sm.metrics}


def _points(m: pb.Metric) -> list[pb.NumberDataPoint]:
    return list(m.gauge.data_points or m.sum.data_points)


Resources = tuple[dict[str, str], dict[str, str]]
ENV_RESOURCE = {"deployment.environment.name": "ci", "service.namespace": "kcops-test"}


def _resource(attributes: Iterable[KeyValue]) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in attributes}


@pytest.fixture
def pushed(
    tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> tuple[dict[str, pb.Metric], str, Resources]:
    # The standard variables: the SDK builds the one Resource from them; spans batched briefly.
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", ",".join(f"{k}={v}" for k, v in ENV_RESOURCE.items())
    )
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    otlp = {"endpoint": receiver.url, "metrics_interval_s": 0.2}
    config = {"exporters": {"otlp": otlp}, "engine": {"url": "http://127.0.0.1:9/"}}
    with agent_in_thread(tmp_path, min_ticks=3, config=config, extra_collectors=[Fixed()]) as url:
        # The first push may come before the first collection: wait for one with data.
        reqs = receiver.wait_for(3)
        traces = receiver.wait_for_traces()  # the rules' evaluation spans
        scraped = httpx.get(url + "/metrics").text
        status = httpx.get(url + "/api/v1/status").json()
    assert status["components"]["otlp_metrics"]["healthy"] is True
    res = _resource(reqs[-1].resource_metrics[0].resource.attributes)
    span_res = _resource(traces[0].resource_spans[0].resource.attributes)
    return _by_name(reqs[-1]), scraped, (res, span_res)


@pytest.mark.slow
def test_metrics_and_spans_carry_one_resource_from_the_environment(
    pushed: tuple[dict[str, pb.Metric], str, Resources],
) -> None:
    _, _, (res, span_res) = pushed
    assert res == span_res
    assert res["service.name"] == "kcops-agent"  # the config's: the environment names none
    assert {k: res[k] for k in ENV_RESOURCE} == ENV_RESOURCE
    assert res["service.version"] == __version__
    assert res["telemetry.sdk.language"] == "python"  # built by the SDK's Resource.create


def test_the_environment_names_the_service_over_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from kcops.agent.telemetry import otel_resource

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.namespace=a")
    plain = otel_resource("from-config")
    assert plain.attributes["service.name"] == "from-config"
    assert otel_resource("from-config") is plain  # one Resource: spans and metrics share it
    monkeypatch.setenv("OTEL_SERVICE_NAME", "from-env")
    named = otel_resource("from-config")
    assert named.attributes["service.name"] == "from-env"
    assert named.attributes["service.namespace"] == "a"


@pytest.mark.slow
def test_pushed_metrics_match_the_scrape(
    pushed: tuple[dict[str, pb.Metric], str, Resources],
) -> None:
    metrics, scraped, _ = pushed
    prom = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(scraped)
        for s in f.samples
    }

    def scrape(name: str, **labels: str) -> float:
        return prom[(name, tuple(sorted(labels.items())))]

    used = metrics["hw.gpu.memory.usage"]
    assert used.unit == "By"
    (p,) = used.gauge.data_points  # the GPU only: the CPU cgroup is not a GPU
    assert _attrs(p) == {"hw.id": "0", "hw.type": "gpu"}
    assert p.as_double == scrape("kcops_device_memory_used_bytes", device="0") == 7.5e9
    (p,) = metrics["hw.gpu.memory.limit"].gauge.data_points
    assert p.as_double == scrape("kcops_device_memory_total_bytes", device="0")
    for fam in ("kcops_device_memory_used_bytes", "kcops_device_memory_total_bytes"):
        (p,) = metrics[fam].gauge.data_points
        assert _attrs(p) == {"device": "cpu"} and p.as_double == scrape(fam, device="cpu")

    restarts = metrics["kcops_engine_restarts"].sum
    assert restarts.is_monotonic
    assert restarts.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert restarts.data_points[0].as_double == scrape("kcops_engine_restarts_total") == 3

    # Plain families: the same labels as attributes and the same value as /metrics.
    for fam, suffix in (
        ("kcops_kv_cache_usage_ratio", ""), ("kcops_shadow_agreement_ratio", ""),
        ("kcops_prefix_cache_hits", "_total"), ("kcops_prefix_cache_queries", "_total"),
        ("kcops_attention_calls", "_total"),
    ):  # fmt: skip
        points = _points(metrics[fam])
        assert points, fam
        for p in points:
            assert p.as_double == scrape(fam + suffix, **_attrs(p)), fam  # type: ignore[arg-type]
    assert len(_points(metrics["kcops_attention_calls"])) == len(LAYERS)

    # Histograms: bounds, per-bucket counts, count and sum, as /metrics has them.
    serving = {
        "kcops_ttft_seconds": "gen_ai.server.time_to_first_token",
        "kcops_inter_token_latency_seconds": "gen_ai.server.time_per_output_token",
        "kcops_request_latency_seconds": "gen_ai.server.request.duration",
        "kcops_kc_tokens": "kcops_kc_tokens",
    }
    for fam, name in serving.items():
        labels = SERVING if name.startswith("gen_ai") else {"layer": LAYERS[0]}
        (h,) = metrics[name].histogram.data_points
        cumulative = [scrape(f"{fam}_bucket", **labels, le=le) for le in ("0.1", "0.5", "+Inf")]
        assert list(h.explicit_bounds) == [0.1, 0.5], fam
        assert list(h.bucket_counts) == [cumulative[0], cumulative[1] - cumulative[0],
                                         cumulative[2] - cumulative[1]], fam  # fmt: skip
        assert h.count == scrape(f"{fam}_count", **labels), fam
        assert math.isclose(h.sum, scrape(f"{fam}_sum", **labels)), fam
    assert metrics["gen_ai.server.time_to_first_token"].unit == "s"

    # Every family the scrape shows went out over OTLP (under its convention name or its own).
    from kcops.agent.otlp_metrics import SEMCONV

    for fam in text_string_to_metric_families(scraped):
        names = {fam.name} | ({SEMCONV[fam.name].name} if fam.name in SEMCONV else set())
        assert names & set(metrics), fam.name


@pytest.mark.slow
def test_gen_ai_metrics_carry_the_conventions_required_attributes(
    pushed: tuple[dict[str, pb.Metric], str, Resources],
) -> None:
    metrics, _, _ = pushed
    for name in (
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.server.request.duration",
    ):
        (h,) = metrics[name].histogram.data_points
        assert _attrs(h) == {
            "gen_ai.operation.name": "text_completion",  # required
            "gen_ai.provider.name": "kcops",  # required (semconv 1.37+)
            "gen_ai.system": "kcops",  # its name up to semconv 1.36
            "gen_ai.request.model": "smollm2",  # conditionally required: the engine names it
            "gen_ai.response.model": "smollm2",
            "server.address": "127.0.0.1",
            "server.port": 9,  # an int, as the convention types it
        }, name


def test_unreachable_collector_is_counted_not_raised(tmp_path: Path) -> None:
    otlp = {"endpoint": "http://127.0.0.1:9", "metrics_interval_s": 0.1, "timeout_s": 1}
    with agent_in_thread(tmp_path, min_ticks=3, config={"exporters": {"otlp": otlp}}) as url:
        deadline = time.monotonic() + 30
        while True:
            comp = httpx.get(url + "/api/v1/status").json()["components"]["otlp_metrics"]
            if not comp["healthy"] or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert comp["healthy"] is False and "127.0.0.1:9" in comp["error"]
