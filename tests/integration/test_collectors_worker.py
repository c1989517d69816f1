"""Against a running ``kcops serve --model tiny`` with the probe installed, the
agent's /metrics shows latency buckets, cache counters, K(C) histograms and
attention call counts, and they move as requests are sent."""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.services import free_port, kcops_bin, running, wait_http, wait_until


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(m: dict, name: str, **match: str) -> float:
    return sum(
        v
        for (n, labels), v in m.items()
        if n == name and all(dict(labels).get(k) == x for k, x in match.items())
    )


def complete(worker: str, prompt: str) -> None:
    r = httpx.post(
        worker + "/v1/completions",
        timeout=120,
        json={"model": "tiny", "prompt": prompt, "max_tokens": 6},
    )
    r.raise_for_status()


def test_agent_sees_the_reference_worker_move(tmp_path: Path) -> None:
    sock = tmp_path / "probe.sock"
    env = {
        "KCOPS_PROBE_SOCKET": str(sock),
        "KCOPS_PROBE_FLUSH_MS": "100",
        "KCOPS_PROBE_SAMPLE_RATE": "1.0",
    }
    aport, wport = free_port(), free_port()
    agent_url, worker_url = f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{wport}"
    agent_cmd = [
        kcops_bin(),
        "agent",
        "run",
        "--listen",
        f"127.0.0.1:{aport}",
        "--state-dir",
        str(tmp_path / "state"),
        "--mode",
        "off",
        "--engine-url",
        worker_url,
        "--tick",
        "0.5",
    ]
    worker_cmd = [kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--threads", "1"]
    with running(agent_cmd, log_path=tmp_path / "agent.log", env=env) as agent:
        wait_http(agent_url + "/healthz", 30, agent)
        with running(worker_cmd, log_path=tmp_path / "worker.log", env=env) as worker:
            wait_http(worker_url + "/health", 180, worker)
            complete(worker_url, "The quick brown fox jumps over the lazy dog. " * 4)
            wait_until(
                lambda: (
                    total(scrape(agent_url), "kcops_request_latency_seconds_count", engine="kcops")
                    >= 1
                ),
                20,
                "the first request's latency on the agent",
            )
            wait_until(
                lambda: total(scrape(agent_url), "kcops_attention_calls_total") > 0,
                20,
                "the probe's attention calls on the agent",
            )
            before = scrape(agent_url)

            for i in range(3):
                complete(
                    worker_url, f"Request {i}: the quick brown fox jumps over the lazy dog. " * 4
                )

            def moved() -> bool:
                m = scrape(agent_url)
                return (
                    total(m, "kcops_request_latency_seconds_count", engine="kcops")
                    >= total(before, "kcops_request_latency_seconds_count", engine="kcops") + 3
                    and total(m, "kcops_attention_calls_total")
                    > total(before, "kcops_attention_calls_total")
                    and total(m, "kcops_kc_tokens_count") > total(before, "kcops_kc_tokens_count")
                )

            wait_until(moved, 30, "the agent's series to move with three more requests")
            after = scrape(agent_url)
            # latency buckets, cache counters, K(C) histograms, attention calls
            assert (
                total(after, "kcops_request_latency_seconds_bucket", engine="kcops", le="+Inf") >= 4
            )
            assert total(after, "kcops_ttft_seconds_count", engine="kcops") >= 4
            assert total(after, "kcops_prefix_cache_queries_total", engine="kcops") > total(
                before, "kcops_prefix_cache_queries_total", engine="kcops"
            )
            assert (
                "kcops_prefix_cache_hits_total",
                (("engine", "kcops"), ("model_name", "tiny")),
            ) in after
            assert total(after, "kcops_kc_tokens_bucket", le="+Inf") == total(
                after, "kcops_kc_tokens_count"
            )
            assert total(after, "kcops_kc_ratio_count") > 0
            # the worker's probe says which engine it is: the same label as its scraped series
            kc = total(after, "kcops_kc_tokens_count")
            assert kc > 0 and total(after, "kcops_kc_tokens_count", engine="kcops") == kc
            assert ("kcops_engine_up", ()) in after and after[("kcops_engine_up", ())] == 1
            # the worker's pid came from /admin/state: its process tree is watched
            assert after.get(("kcops_process_up", (("process", "engine"),))) == 1
            assert total(after, "kcops_device_memory_used_bytes", device="cpu") > 0
            assert agent.poll() is None
