"""Adding an engine kind is one file plus registering it: the toy kind, end to end.

``toy_kind.py`` is the whole engine kind. A real aiohttp server plays the
engine (its ``/metrics``, its probe route, its admin routes); the agent's own
parts do the rest: the scrape collector detects the kind from the page and
maps its families to canonical ``kcops_*`` series, the engine object detects
it by its probe, checks its capabilities, calls its admin routes and reports
what the server answered, and the shutdown drain reads its command line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from kcops.agent.collectors.engine_http import EngineClient
from kcops.agent.collectors.scrape import EngineScrapeCollector
from kcops.agent.engine import Engine, EngineFailed
from kcops.agent.engine.kinds import Adapter, EngineKind, EngineRegistry, builtin_kinds
from kcops.agent.engine.shutdown import engine_drain_s
from kcops.agent.outcome import ActionRejected
from tests.unit.collectors.helpers import latest, runner
from tests.unit.engine import toy_kind

PAGE = b"""\
# HELP toyserve_request_ms Request latency in milliseconds.
# TYPE toyserve_request_ms histogram
toyserve_request_ms_bucket{le="100.0"} 3.0
toyserve_request_ms_bucket{le="1000.0"} 5.0
toyserve_request_ms_bucket{le="+Inf"} 6.0
toyserve_request_ms_sum 2500.0
toyserve_request_ms_count 6.0
# TYPE toyserve_queue_depth gauge
toyserve_queue_depth 4.0
# TYPE toyserve_active gauge
toyserve_active 2.0
# TYPE toyserve_cache_hits counter
toyserve_cache_hits_total 17.0
# TYPE toyserve_unmapped gauge
toyserve_unmapped 9.0
"""


class ToyServe:
    """The engine: serves its page and probe, records every admin call and its body."""

    def __init__(self) -> None:
        self.admin: list[tuple[str, str, object]] = []
        self.flushed = 0
        self.busy = False

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/metrics":
            return web.Response(body=PAGE, headers={"Content-Type": "text/plain; version=0.0.4"})
        if path == "/toy/whoami" and request.method == "GET":
            return web.json_response({"engine": "toyserve"})
        if request.method == "POST" and path.startswith("/toy/"):
            raw = await request.read()
            self.admin.append((path, request.query_string, json.loads(raw) if raw else None))
            if path == "/toy/flush":
                if self.busy:
                    return web.json_response({"success": False})
                self.flushed += 1
                return web.json_response({"success": True, "blocks_freed": 42})
            if path == "/toy/admission":
                return web.json_response({"ok": True})
        return web.Response(status=404)


@asynccontextmanager
async def serving(handler: ToyServe) -> AsyncIterator[str]:
    server = web.Server(handler)
    r = web.ServerRunner(server, access_log=None)
    await r.setup()
    site = web.TCPSite(r, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{r.addresses[0][1]}"
    finally:
        await r.cleanup()


def registry() -> EngineRegistry:
    reg = builtin_kinds()
    reg.register(toy_kind.KIND)  # the one registration call
    return reg


def test_scrape_detects_the_new_kind_and_maps_it_to_canonical_series() -> None:
    toy = ToyServe()

    async def body() -> tuple[Engine, EngineScrapeCollector, list[float | None]]:
        async with serving(toy) as url:
            engine = Engine(url, "auto", registry=registry())
            client = EngineClient(url, timeout_s=2.0, http=engine.http)
            scrape = EngineScrapeCollector(client, "auto", engine)
            r, store = runner(scrape)
            await r.tick(10.0)
            await engine.aclose()
            got = [
                latest(store, "kcops_requests_waiting", engine="toyserve"),
                latest(store, "kcops_requests_running", engine="toyserve"),
                latest(store, "kcops_prefix_cache_hits_total", engine="toyserve"),
                # milliseconds converted to seconds: le 100 ms -> 0.1 s, sum 2500 ms -> 2.5 s
                latest(store, "kcops_request_latency_seconds_bucket", engine="toyserve", le="0.1"),
                latest(store, "kcops_request_latency_seconds_sum", engine="toyserve"),
                latest(store, "kcops_request_latency_seconds_count", engine="toyserve"),
            ]
            return engine, scrape, got

    engine, scrape, got = asyncio.run(body())
    assert got == [4.0, 2.0, 17.0, 3.0, 2.5, 6.0]
    assert scrape.kind is toy_kind.KIND
    assert engine.adapter == "toyserve"  # learnt from the page, for the actions
    assert engine.capabilities is not None and engine.capabilities.evict == {"all"}


def test_the_default_registry_does_not_know_the_toy() -> None:
    toy = ToyServe()

    async def body() -> None:
        async with serving(toy) as url:
            client = EngineClient(url, timeout_s=2.0)
            scrape = EngineScrapeCollector(client, "auto")
            try:
                with pytest.raises(Exception, match="cannot tell the engine"):
                    await scrape.collect(10.0)
            finally:
                await client.stop()

    asyncio.run(body())
    with pytest.raises(ValueError, match="allowed"):
        Engine("http://127.0.0.1:1", "toyserve")


def test_actions_reach_the_new_kinds_admin_routes_and_report_the_answer() -> None:
    toy = ToyServe()

    async def body() -> None:
        async with serving(toy) as url:
            engine = Engine(url, "auto", registry=registry())
            try:
                # No /metrics read yet: its probe route identifies it (the others 404).
                assert await engine.resolve() == "toyserve"
                out = await engine.evict("all", 1.0, drop_running=True)
                assert out == {
                    "policy": "all",
                    "route": "/toy/flush",
                    "response": {"success": True, "blocks_freed": 42},
                }
                toy.busy = True
                failed = "toyserve /toy/flush answered success=false"
                with pytest.raises(EngineFailed, match=failed):
                    await engine.evict("all", 1.0)
                # What its routes lack is refused before any call, never widened.
                with pytest.raises(ActionRejected, match="toyserve cannot evict with policy 'lru'"):
                    engine.require("evict", policy="lru")
                with pytest.raises(ActionRejected, match="toyserve has no route control"):
                    await engine.set_route("base")
                assert await engine.stop_admitting(deadline_s=5) == "drain"
                await engine.resume_admitting("drain")
            finally:
                await engine.aclose()

    asyncio.run(body())
    assert toy.flushed == 1
    # No drop-running flag declared: none sent. Drain bodies as the kind's route takes them.
    assert toy.admin == [
        ("/toy/flush", "", None),
        ("/toy/flush", "", None),
        ("/toy/admission", "", {"admit": False}),
        ("/toy/admission", "", {"admit": True}),
    ]


def test_the_new_kinds_command_line_says_what_it_is_and_how_long_it_drains() -> None:
    argv = ["toyserve", "--model", "m", "--toy-grace", "7"]
    assert registry().detect_command(argv) is toy_kind.KIND
    assert builtin_kinds().detect_command(argv) is None
    assert engine_drain_s(argv, None, registry=registry()) == 7
    assert engine_drain_s(argv, None) == 0  # the built-in kinds do not read --toy-grace
    # vLLM's --shutdown-timeout is still read beside it.
    assert engine_drain_s([*argv, "--shutdown-timeout", "30"], None, registry=registry()) == 30


def test_registering_refuses_a_taken_or_reserved_name() -> None:
    reg = registry()
    with pytest.raises(ValueError, match="already registered"):
        reg.register(toy_kind.KIND)
    with pytest.raises(ValueError, match="already registered"):
        reg.register(builtin_kinds().get("vllm"))
    with pytest.raises(ValueError, match="reserved"):
        reg.register(EngineKind(adapter=Adapter("auto", ())))
    assert reg.choices()[-1] == "toyserve" and "toyserve" not in builtin_kinds()


def test_a_kind_registered_before_another_is_detected_first() -> None:
    both = {"vllm:num_requests_running", "toyserve_active"}
    later = registry()
    assert later.detect(both) is later.get("vllm")
    ahead = builtin_kinds()
    ahead.register(toy_kind.KIND, before="vllm")
    assert ahead.names() == ("kcops", "sglang", "toyserve", "vllm", "tgi", "triton")
    assert ahead.detect(both) is toy_kind.KIND
