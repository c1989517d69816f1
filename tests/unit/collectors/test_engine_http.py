"""The shared engine poll against a real HTTP server on 127.0.0.1 (aiohttp, in the test's loop)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web

from kcops.agent.collectors.base import CollectorRunner
from kcops.agent.collectors.engine_http import EngineClient
from kcops.agent.collectors.health import HealthCollector
from kcops.agent.collectors.scrape import EngineScrapeCollector
from kcops.agent.engine.pid import EnginePid
from kcops.agent.store import Store
from kcops.errors import CollectorUnavailable
from tests.unit.collectors.helpers import latest, runner, value

VLLM_PAGE = (Path(__file__).resolve().parents[2] / "fixtures" / "vllm_metrics.txt").read_bytes()
TEXT = "text/plain; version=0.0.4"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Engine:
    """A real engine stand-in: a page, a health status, /admin/state; counts the calls."""

    def __init__(self, metrics: bytes = VLLM_PAGE, health: int = 200, ctype: str = TEXT) -> None:
        self.metrics, self.health, self.ctype = metrics, health, ctype
        self.calls: dict[str, int] = {}

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        self.calls[path] = self.calls.get(path, 0) + 1
        if path == "/health":
            return web.Response(status=self.health)
        if path == "/metrics":
            return web.Response(body=self.metrics, headers={"Content-Type": self.ctype})
        if path == "/admin/state":
            return web.json_response({"pid": 4242, "model": "tiny"})
        return web.Response(status=404)


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    server = web.Server(handler)
    runner_ = web.ServerRunner(server, access_log=None)
    await runner_.setup()
    site = web.TCPSite(runner_, "127.0.0.1", 0)
    await site.start()
    port = runner_.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner_.cleanup()


def make(url: str, adapter: str = "auto", timeout_s: float = 0.5):  # type: ignore[no-untyped-def]
    pids = EnginePid()
    client = EngineClient(url, timeout_s=timeout_s, pids=pids)
    return client, HealthCollector(client), EngineScrapeCollector(client, adapter), pids


def test_scrape_and_health_share_one_poll_per_tick() -> None:
    engine = Engine()

    async def body() -> tuple[CollectorRunner, Store, EngineScrapeCollector]:
        async with serving(engine) as url:
            client, health, scrape, _ = make(url)
            r, store = runner(health, scrape)
            await r.tick(10.0)
            await client.stop()
            return r, store, scrape

    _, store, scrape = asyncio.run(body())
    assert engine.calls == {"/health": 1, "/metrics": 1}
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
    release = asyncio.Event()

    async def hung(request: web.Request) -> web.Response:
        await release.wait()  # answers only once the test is over
        return web.Response()

    async def body() -> tuple[CollectorRunner, Store]:
        async with serving(hung) as url:
            client, health, scrape, _ = make(url, timeout_s=0.05)
            r, store = runner(health, scrape)
            await r.tick(1.0)
            await r.tick(2.0)
            await client.stop()
            release.set()
            return r, store

    r, store = asyncio.run(body())
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


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def test_health_age_grows_after_the_engine_stops_answering() -> None:
    async def body() -> Store:
        async with serving(Engine()) as url:
            client, health, _, _ = make(url)
            r, store = runner(health)
            await r.tick(100.0)
        # the server is gone: connection refused
        await r.tick(101.0)
        await r.tick(103.5)
        await client.stop()
        return store

    store = asyncio.run(body())
    assert latest(store, "kcops_engine_up") == 0
    assert latest(store, "kcops_engine_last_healthy_age_seconds") == 3.5
    assert latest(store, "kcops_engine_health_checks_total", outcome="connect") == 2


def test_an_engine_that_hangs_up_or_speaks_no_http_is_a_protocol_error() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()  # no answer at all

    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    async def body(serve: Callable[..., Awaitable[None]]) -> str | None:
        srv = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        client, _, _, _ = make(f"http://127.0.0.1:{port}")
        f = await client.fetch("/health")
        await client.stop()
        srv.close()
        await srv.wait_closed()
        assert not f.ok
        return f.reason

    assert asyncio.run(body(hang_up)) == "protocol"
    assert asyncio.run(body(garbage)) == "protocol"

    async def refused() -> str:
        client, _, _, _ = make(f"http://127.0.0.1:{_closed_port()}")
        f = await client.fetch("/health")
        await client.stop()
        return f.reason

    assert asyncio.run(refused()) == "connect"


@pytest.mark.parametrize(
    ("body", "ctype", "reason"),
    [
        (VLLM_PAGE[: len(VLLM_PAGE) // 2 + 7], TEXT, "truncated"),
        (b"<html>oops</html>\n", "text/html", "parse"),
        (b"<html>oops</html>\n", "text/plain", "parse"),
        (b"\xff\xfe\x00garbage", "text/plain", "parse"),
        (b"# TYPE python_gc gauge\npython_gc 1\n", "text/plain", "unknown_engine"),
    ],
)
def test_bad_metrics_pages_are_counted_and_the_agent_goes_on(
    body: bytes, ctype: str, reason: str
) -> None:
    async def go() -> Store:
        async with serving(Engine(metrics=body, ctype=ctype)) as url:
            client, health, scrape, _ = make(url)
            r, store = runner(health, scrape)
            await r.tick(1.0)
            await client.stop()
            return store

    store = asyncio.run(go())
    assert (
        latest(store, "kcops_collector_errors_total", collector="engine_scrape", reason=reason) == 1
    )
    assert latest(store, "kcops_engine_up") == 1  # health is independent


def test_http_error_status_and_too_large_body() -> None:
    async def unavailable(request: web.Request) -> web.Response:
        return web.Response(status=503 if request.path == "/metrics" else 200)

    async def go() -> tuple[str, str, str]:
        async with serving(unavailable) as url:
            client, _, scrape, _ = make(url, adapter="vllm")
            with pytest.raises(CollectorUnavailable) as info:
                await scrape.collect(1.0)
            status = info.value.reason
            await client.stop()
        async with serving(Engine(metrics=b"x 1\n" * 10_000)) as url:
            client, _, scrape, _ = make(url, adapter="vllm")
            client.max_body_bytes = 1024
            with pytest.raises(CollectorUnavailable) as info:
                await scrape.collect(1.0)
            large = info.value.reason
            await client.stop()

        async def chunked(request: web.Request) -> web.StreamResponse:  # no Content-Length
            resp = web.StreamResponse(headers={"Content-Type": TEXT})
            await resp.prepare(request)
            for _ in range(100):
                await resp.write(b"x 1\n" * 100)
            await resp.write_eof()
            return resp

        async with serving(chunked) as url:
            client, _, scrape, _ = make(url, adapter="vllm")
            client.max_body_bytes = 1024
            with pytest.raises(CollectorUnavailable) as info:
                await scrape.collect(2.0)
            streamed = info.value.reason
            await client.stop()
        return status, large, streamed

    assert asyncio.run(go()) == ("http_status", "too_large", "too_large")


def test_counter_reset_is_passed_on_raw() -> None:
    engine = Engine(metrics=b'vllm:prefix_cache_hits_total{model_name="m"} 50\n')

    async def go() -> Store:
        async with serving(engine) as url:
            client, _, scrape, _ = make(url, adapter="vllm")
            r, store = runner(scrape)
            await r.tick(1.0)
            engine.metrics = b'vllm:prefix_cache_hits_total{model_name="m"} 3\n'
            await r.tick(2.0)
            await client.stop()
            return store

    store = asyncio.run(go())
    key = ("kcops_prefix_cache_hits_total", {"engine": "vllm", "model_name": "m"})
    assert latest(store, key[0], **key[1]) == 3  # the rule engine's rate() sees the reset


def test_kcops_worker_pid_comes_from_admin_state() -> None:
    page = VLLM_PAGE + b"# TYPE kcops_worker_attention_topn gauge\nkcops_worker_attention_topn 64\n"
    engine = Engine(metrics=page)

    async def go() -> tuple[EngineScrapeCollector, EnginePid, float | None]:
        async with serving(engine) as url:
            client, _, scrape, pids = make(url)
            await scrape.collect(1.0)  # detects kcops, asks for /admin/state from now on
            await scrape.collect(2.0)
            await scrape.collect(3.0)  # within state_interval_s: not fetched again
            out = await scrape.collect(10.0)
            await client.stop()
            return scrape, pids, value(out, "kcops_attention_topn", engine="kcops")

    scrape, pids, topn = asyncio.run(go())
    assert scrape.adapter is not None and scrape.adapter.name == "kcops"
    assert pids.resolve() == 4242 and pids.source == "admin_state"
    assert engine.calls["/admin/state"] == 2  # at 2.0 and at 10.0
    assert topn == 64
