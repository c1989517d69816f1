"""The stall watch against a real HTTP engine: progress from the store, the canary over
the wire, the lifecycle verdict (stalled only when the canary fails too), status."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from kcops.agent.engine import Engine, EngineState
from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine.canary import Canary, CanaryConfig
from kcops.agent.engine.watch import StallWatch
from kcops.agent.samples import Sample
from kcops.agent.store import Store
from tests.unit.collectors.helpers import value


class Completions:
    """``/v1/models`` and ``/v1/completions``; a completion waits while ``stuck`` is clear."""

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.bodies: list[dict[str, object]] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> str:
        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "tiny"}]})

        async def complete(request: web.Request) -> web.Response:
            self.bodies.append(await request.json())
            await self.flowing.wait()
            return web.json_response({"choices": [{"text": "x"}]})

        app = web.Application()
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/completions", complete)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        self.flowing.set()
        if self._runner is not None:
            await self._runner.cleanup()


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(400):  # a condition, waited on; the bound only ends a broken run
        if check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never: {what}")


def feed(store: Store, t: float, pending: float | None, gen: float | None) -> None:
    samples = []
    if pending is not None:
        samples.append(Sample.of("kcops_requests_running", pending, {"engine": "vllm"}))
    if gen is not None:
        samples.append(Sample.of("kcops_generation_tokens_total", gen, {"engine": "vllm"}))
    store.add(samples, t)


def run(body: Callable[[Completions, str], Awaitable[None]]) -> None:
    async def main() -> None:
        srv = Completions()
        url = await srv.start()
        try:
            await body(srv, url)
        finally:
            await srv.stop()

    asyncio.run(main())


def setup(url: str, enabled: bool = True) -> tuple[Store, Engine, StallWatch]:
    store = Store()
    eng = Engine(url, "vllm", now=0.0)
    eng.observe(lc.Health(0.0, True))
    canary = Canary(url, eng.http, CanaryConfig(interval_s=60, deadline_s=0.3)) if enabled else None
    return store, eng, StallWatch(store, eng, stall_after_s=5.0, canary=canary)


def test_stalled_once_no_progress_and_the_canary_times_out_then_ready_again() -> None:
    async def body(srv: Completions, url: str) -> None:
        store, eng, watch = setup(url)
        assert watch.canary is not None
        for t in (0, 1):  # idle: no canary
            feed(store, t, 0, 100)
            assert value(watch.collect(float(t)), "kcops_engine_stalled_seconds") is None
        for t in (2, 3, 4):  # tokens flow: the periodic clock starts, no canary yet
            feed(store, t, 2, 100 + t)
            assert value(watch.collect(float(t)), "kcops_engine_stalled_seconds") == 0.0
        assert watch.canary.in_flight_since is None and watch.canary.last is None
        feed(store, 62, 2, 200)  # an interval (60 s) after the first progress: one canary
        watch.collect(62.0)
        await until(lambda: watch.canary is not None and watch.canary.last is not None, "ok")
        assert watch.canary.last is not None and watch.canary.last.ok
        assert srv.bodies == [
            {"prompt": "Hi", "max_tokens": 1, "temperature": 0, "stream": False, "model": "tiny"}
        ]
        feed(store, 63, 2, 201)
        watch.collect(63.0)
        assert watch.canary.in_flight_since is None and len(srv.bodies) == 1  # not due
        srv.flowing.clear()  # the engine stops: counters still, completions never answer
        for t in (64, 65, 66, 67):
            feed(store, t, 2, 201)
            out = watch.collect(float(t))
            assert value(out, "kcops_engine_stalled_seconds") == t - 63.0
            assert eng.state is EngineState.READY  # under stall_after_s (5 s)
        # No canary for a short pause: it goes once still for stall_after_s - deadline_s.
        assert len(srv.bodies) == 1
        feed(store, 68, 2, 201)
        out = watch.collect(68.0)
        assert value(out, "kcops_engine_stalled_seconds") == 5.0
        assert watch.canary.in_flight_since == 68.0
        assert eng.state is EngineState.READY  # past the threshold, the canary not failed yet
        await until(
            lambda: watch.canary is not None and watch.canary.in_flight_since is None, "done"
        )
        assert watch.canary.last is not None and watch.canary.last.outcome == "timeout"
        feed(store, 69, 2, 201)
        out = watch.collect(69.0)
        assert value(out, "kcops_engine_stalled_seconds") == 6.0
        assert value(out, "kcops_engine_canary_success") == 0.0
        assert value(out, "kcops_engine_canary_runs_total", outcome="timeout") == 1.0
        assert eng.state is EngineState.STALLED and not eng.serving()
        ev = eng.evidence()
        assert ev["stalled_s"] == 6.0 and ev["pending"] == 2
        assert isinstance(ev["canary"], dict) and ev["canary"]["outcome"] == "timeout"
        srv.flowing.set()
        feed(store, 70, 2, 202)  # a token: progress ends the stall
        watch.collect(70.0)
        assert eng.state is EngineState.READY
        await eng.aclose()

    run(body)


def test_a_canary_that_answers_keeps_a_still_engine_ready() -> None:
    """Counters that do not move while the engine serves (a canary answers): not stalled."""

    async def body(srv: Completions, url: str) -> None:
        store, eng, watch = setup(url)
        for t in range(10):
            feed(store, t, 1, 50)
            watch.collect(float(t))
            await until(
                lambda: watch.canary is not None and watch.canary.in_flight_since is None, "c"
            )
        assert value(watch.collect(10.0), "kcops_engine_stalled_seconds") == 10.0
        assert eng.state is EngineState.READY
        await eng.aclose()

    run(body)


def test_without_a_canary_the_threshold_alone_decides_and_idle_is_absent() -> None:
    async def body(_: Completions, url: str) -> None:
        store, eng, watch = setup(url, enabled=False)
        feed(store, 0, 0, 7)
        out = watch.collect(0.0)
        assert value(out, "kcops_engine_stalled_seconds") is None  # idle: absent
        assert value(out, "kcops_engine_pending_requests") == 0.0
        for t in range(1, 6):
            feed(store, t, 3, 7)
            watch.collect(float(t))
        assert eng.state is EngineState.STALLED
        await eng.aclose()

    run(body)


def test_an_engine_without_progress_counters_is_not_watched_and_says_so() -> None:
    async def body(_: Completions, url: str) -> None:
        store = Store()
        eng = Engine(url, "tgi", now=0.0)
        eng.observe(lc.Health(0.0, True))
        watch = StallWatch(store, eng, stall_after_s=1.0)
        for t in range(5):
            feed(store, t, 4, None)  # requests pending, nothing to read progress from
            out = watch.collect(float(t))
            assert value(out, "kcops_engine_stalled_seconds") is None
            assert value(out, "kcops_engine_progress_watched") == 0.0
        rep = eng.report()["progress"]
        assert isinstance(rep, dict)
        assert rep["watched"] is False and "does not read as healthy" in str(rep["why"])
        assert "tgi exports no progress counter" in str(rep["kind_lacks"])
        assert eng.state is EngineState.READY
        await eng.aclose()

    run(body)


def test_every_series_of_the_watch_is_catalogued() -> None:
    from kcops.agent.signals import SIGNALS

    async def body(srv: Completions, url: str) -> None:
        store, eng, watch = setup(url)
        srv.flowing.clear()
        names = set()
        for t in range(8):
            feed(store, t, 1, 5)
            names |= {s.name for s in watch.collect(float(t))}
            await until(lambda: watch.canary is None or watch.canary.in_flight_since is None, "c")
        assert names >= {"kcops_engine_stalled_seconds", "kcops_engine_canary_runs_total"}
        for n in names:
            assert n in SIGNALS, n
            assert SIGNALS[n].type != "counter" or n.endswith("_total")
        await eng.aclose()

    run(body)
