"""OTLP metrics: a real OTLP/HTTP receiver decodes what the agent pushes; values match /metrics."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.metrics.v1 import metrics_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families

from kcops.agent.samples import Sample
from tests.services import agent_in_thread


class Receiver:
    """An OTLP/HTTP metrics endpoint: decodes each ExportMetricsServiceRequest it is sent."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                req = ExportMetricsServiceRequest()
                req.ParseFromString(body)
                ok = self.path == "/v1/metrics" and (
                    self.headers["Content-Type"] == "application/x-protobuf"
                )
                with outer.cond:
                    if ok:
                        outer.requests.append(req)
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


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


class Fixed:
    """Constant series of each kind, so a push and a scrape taken apart still agree."""

    name = "fixed"

    def collect(self, now: float) -> list[Sample]:
        dev = {"device": "0"}
        out = [
            Sample.of("kcops_device_memory_used_bytes", 7.5e9, dev),
            Sample.of("kcops_device_memory_total_bytes", 8e9, dev),
            Sample.of("kcops_kv_cache_usage_ratio", 0.25),
            Sample.of("kcops_engine_restarts_total", 3),
        ]
        for le, n in (("0.1", 4), ("0.5", 9), ("+Inf", 10)):
            out.append(Sample.of("kcops_ttft_seconds_bucket", n, {"le": le}))
        out += [Sample.of("kcops_ttft_seconds_count", 10), Sample.of("kcops_ttft_seconds_sum", 2.5)]
        return out


def _attrs(point: pb.NumberDataPoint | pb.HistogramDataPoint) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def _by_name(req: ExportMetricsServiceRequest) -> dict[str, pb.Metric]:
    (rm,) = req.resource_metrics
    (sm,) = rm.scope_metrics
    return {m.name: m for m in sm.metrics}


@pytest.mark.slow
def test_pushed_metrics_match_the_scrape(tmp_path: Path, receiver: Receiver) -> None:
    otlp = {"endpoint": receiver.url, "metrics_interval_s": 0.2}
    with agent_in_thread(
        tmp_path, min_ticks=3, config={"exporters": {"otlp": otlp}}, extra_collectors=[Fixed()]
    ) as url:
        # The first push may come before the first collection: wait for one with data.
        reqs = receiver.wait_for(3)
        scraped = httpx.get(url + "/metrics").text
        status = httpx.get(url + "/api/v1/status").json()
    metrics = _by_name(reqs[-1])
    res = {kv.key: kv.value.string_value for kv in reqs[-1].resource_metrics[0].resource.attributes}
    assert res["service.name"] == "kcops-agent"
    assert status["components"]["otlp_metrics"]["healthy"] is True
    prom = {s.name: s for f in text_string_to_metric_families(scraped) for s in f.samples}

    used = metrics["hw.gpu.memory.usage"]
    assert used.unit == "By"
    (p,) = used.gauge.data_points
    assert _attrs(p) == {"hw.id": "0", "hw.type": "gpu"}
    assert p.as_double == prom["kcops_device_memory_used_bytes"].value == 7.5e9
    (p,) = metrics["hw.gpu.memory.limit"].gauge.data_points
    assert p.as_double == prom["kcops_device_memory_total_bytes"].value

    (p,) = metrics["kcops_kv_cache_usage_ratio"].gauge.data_points
    assert p.as_double == prom["kcops_kv_cache_usage_ratio"].value == 0.25

    restarts = metrics["kcops_engine_restarts"].sum
    assert restarts.is_monotonic
    assert restarts.aggregation_temporality == pb.AGGREGATION_TEMPORALITY_CUMULATIVE
    assert restarts.data_points[0].as_double == prom["kcops_engine_restarts_total"].value == 3

    ttft = metrics["gen_ai.server.time_to_first_token"]
    assert ttft.unit == "s"
    (h,) = ttft.histogram.data_points
    assert list(h.explicit_bounds) == [0.1, 0.5]
    assert list(h.bucket_counts) == [4, 5, 1]
    assert h.count == prom["kcops_ttft_seconds_count"].value == 10
    assert math.isclose(h.sum, prom["kcops_ttft_seconds_sum"].value)
    # Every family the scrape shows went out over OTLP (under its convention name or its own).
    pushed = set(metrics)
    for fam in text_string_to_metric_families(scraped):
        from kcops.agent.otlp_metrics import SEMCONV

        name = SEMCONV[fam.name].name if fam.name in SEMCONV else fam.name
        assert name in pushed, fam.name


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
