from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kcops.agent.collectors.engine_http import EngineClient
from kcops.agent.collectors.enginepid import EnginePid
from kcops.agent.collectors.health import HealthCollector
from kcops.agent.collectors.scrape import EngineScrapeCollector
from kcops.errors import CollectorUnavailable
from tests.unit.collectors.helpers import latest, runner, value

VLLM_PAGE = (Path(__file__).resolve().parents[2] / "fixtures" / "vllm_metrics.txt").read_bytes()
TEXT = {"content-type": "text/plain; version=0.0.4"}


def make(handler: Callable, adapter: str = "auto", timeout_s: float = 0.2):  # type: ignore[no-untyped-def]
    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    pids = EnginePid()
    client = EngineClient("http://engine", timeout_s=timeout_s, http=http, pids=pids)
    return client, HealthCollector(client), EngineScrapeCollector(client, adapter), pids


def serve(metrics: bytes = VLLM_PAGE, health: int = 200, ctype: str = TEXT["content-type"]):  # type: ignore[no-untyped-def]
    calls: dict[str, int] = {}

    def handler(req: httpx.Request) -> httpx.Response:
        calls[req.url.path] = calls.get(req.url.path, 0) + 1
        if req.url.path == "/health":
            return httpx.Response(health)
        if req.url.path == "/metrics":
            return httpx.Response(200, content=metrics, headers={"content-type": ctype})
        if req.url.path == "/admin/state":
            return httpx.Response(200, json={"pid": 4242, "model": "tiny"})
        return httpx.Response(404)

    handler.calls = calls  # type: ignore[attr-defined]
    return handler


def test_scrape_and_health_share_one_poll_per_tick() -> None:
    h = serve()
    _, health, scrape, _ = make(h)
    r, store = runner(health, scrape)
    asyncio.run(r.tick(10.0))
    assert h.calls == {"/health": 1, "/metrics": 1}
    assert latest(store, "kcops_engine_up") == 1
    assert latest(store, "kcops_engine_last_healthy_age_seconds") == 0
    assert (
        latest(
            store,
            "kcops_requests_running",
            engine="vllm",
            engine_index="0",
            model_name="SmolLM2-135M-Instruct",
        )
        == 2
    )
    assert scrape.adapter is not None and scrape.adapter.name == "vllm"


def test_engine_that_times_out_is_counted_and_reads_as_down() -> None:
    async def slow(req: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)
        return httpx.Response(200)

    client, health, scrape, _ = make(slow, timeout_s=0.05)
    r, store = runner(health, scrape)

    async def ticks() -> None:
        await r.tick(1.0)
        await r.tick(2.0)
        await client.stop()

    asyncio.run(ticks())
    assert latest(store, "kcops_engine_up") == 0
    assert latest(store, "kcops_engine_last_healthy_age_seconds") is None  # never answered: absent
    assert latest(store, "kcops_engine_health_checks_total", outcome="timeout") == 2
    assert (
        latest(store, "kcops_collector_errors_total", collector="engine_scrape", reason="timeout")
        == 2
    )
    assert (
        r.health["engine_scrape"].last_error and "no answer" in r.health["engine_scrape"].last_error
    )


def test_health_age_grows_after_the_engine_stops_answering() -> None:
    state = {"up": True}

    def handler(req: httpx.Request) -> httpx.Response:
        if not state["up"]:
            raise httpx.ConnectError("refused", request=req)
        return httpx.Response(200, content=VLLM_PAGE, headers=TEXT)

    _, health, _, _ = make(handler)
    r, store = runner(health)
    asyncio.run(r.tick(100.0))
    state["up"] = False
    asyncio.run(r.tick(101.0))
    asyncio.run(r.tick(103.5))
    assert latest(store, "kcops_engine_up") == 0
    assert latest(store, "kcops_engine_last_healthy_age_seconds") == 3.5
    assert latest(store, "kcops_engine_health_checks_total", outcome="connect") == 2


@pytest.mark.parametrize(
    ("body", "ctype", "reason"),
    [
        (VLLM_PAGE[: len(VLLM_PAGE) // 2 + 7], TEXT["content-type"], "truncated"),
        (b"<html>oops</html>\n", "text/html", "parse"),
        (b"<html>oops</html>\n", "text/plain", "parse"),
        (b"\xff\xfe\x00garbage", "text/plain", "parse"),
        (b"# TYPE python_gc gauge\npython_gc 1\n", "text/plain", "unknown_engine"),
    ],
)
def test_bad_metrics_pages_are_counted_and_the_agent_goes_on(
    body: bytes, ctype: str, reason: str
) -> None:
    _, health, scrape, _ = make(serve(metrics=body, ctype=ctype))
    r, store = runner(health, scrape)
    asyncio.run(r.tick(1.0))
    assert (
        latest(store, "kcops_collector_errors_total", collector="engine_scrape", reason=reason) == 1
    )
    assert latest(store, "kcops_engine_up") == 1  # health is independent


def test_http_error_status_and_too_large_body() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(503 if req.url.path == "/metrics" else 200)

    _, _, scrape, _ = make(handler, adapter="vllm")
    with pytest.raises(CollectorUnavailable) as info:
        asyncio.run(scrape.collect(1.0))
    assert info.value.reason == "http_status"

    client, _, scrape, _ = make(serve(metrics=b"x 1\n" * 10_000), adapter="vllm")
    client.max_body_bytes = 1024
    with pytest.raises(CollectorUnavailable) as info:
        asyncio.run(scrape.collect(1.0))
    assert info.value.reason == "too_large"


def test_counter_reset_is_passed_on_raw() -> None:
    pages = [
        b'vllm:prefix_cache_hits_total{model_name="m"} 50\n',
        b'vllm:prefix_cache_hits_total{model_name="m"} 3\n',
    ]

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=pages[0], headers=TEXT)

    _, _, scrape, _ = make(handler, adapter="vllm")
    r, store = runner(scrape)
    asyncio.run(r.tick(1.0))
    pages.pop(0)
    asyncio.run(r.tick(2.0))
    key = ("kcops_prefix_cache_hits_total", {"engine": "vllm", "model_name": "m"})
    assert latest(store, key[0], **key[1]) == 3  # the rule engine's rate() sees the reset


def test_kcops_worker_pid_comes_from_admin_state() -> None:
    page = VLLM_PAGE + b"# TYPE kcops_worker_attention_topn gauge\nkcops_worker_attention_topn 64\n"
    h = serve(metrics=page)
    _, _, scrape, pids = make(h)

    async def ticks() -> None:
        await scrape.collect(1.0)  # detects kcops, asks for /admin/state from now on
        await scrape.collect(2.0)
        await scrape.collect(3.0)  # within state_interval_s: not fetched again

    asyncio.run(ticks())
    assert scrape.adapter is not None and scrape.adapter.name == "kcops"
    assert pids.resolve() == 4242 and pids.source == "admin_state"
    assert h.calls["/admin/state"] == 1
    out = asyncio.run(scrape.collect(10.0))
    assert value(out, "kcops_attention_topn", engine="kcops") == 64
