"""The one place that wires the agent together and runs its loop.

It builds the store, the clock, the exporter, the tracer and the components,
and drives them each tick in order: collectors, then rules, then remediation.
Nothing else in the agent creates singletons or registers itself anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web

from kcops import __version__
from kcops.agent import collectors as collectors_pkg
from kcops.agent import incidents as incidents_pkg
from kcops.agent import remediation as remediation_pkg
from kcops.agent import rules as rules_pkg
from kcops.agent.backoff import LoopErrors
from kcops.agent.clock import Clock, system_clock
from kcops.agent.collectors import CollectorRunner, tick_histogram
from kcops.agent.collectors.base import Collector
from kcops.agent.component import AgentContext, Component
from kcops.agent.config import Config
from kcops.agent.control import build_app, core_routes
from kcops.agent.engine import Engine
from kcops.agent.engine.pid import EnginePid
from kcops.agent.events import EventBus
from kcops.agent.exporter import StoreExporter
from kcops.agent.jsonapi import error_body
from kcops.agent.kcrec import Recommender
from kcops.agent.preflight import check_machine, preflight
from kcops.agent.promql.regex import CACHE as REGEX_CACHE
from kcops.agent.query import QueryComponent
from kcops.agent.samples import Sample
from kcops.agent.signals import register_all
from kcops.agent.store import Store
from kcops.agent.telemetry import build_metric_exporters, build_tracer_provider
from kcops.auth import TokenCheck
from kcops.errors import ConfigError
from kcops.httpedge import JsonErrorRunner

if TYPE_CHECKING:
    from kcops.agent.engine.supervisor import Supervisor

log = logging.getLogger("kcops.agent")

EVICT_EVERY_TICKS = 10


class Agent:
    """The running sidecar. ``await agent.run()`` until SIGTERM/SIGINT or :meth:`request_stop`."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock = system_clock,
        token: str | None = None,
        extra_components: list[Component] | None = None,
        extra_collectors: list[Collector] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.started_at = clock()
        self.ticks_done = 0
        st = config.store
        self.store = Store(
            st.retention_s, st.max_series, st.max_bytes,
            max_series_per_source=st.max_series_per_source, quiet_after_s=st.stale_after_s,
        )  # fmt: skip
        register_all(self.store)
        self.exporter = StoreExporter(self.store, clock, config.store.stale_after_s)
        self.tracer_provider = build_tracer_provider(config.exporters.otlp)
        # Everything `kcops agent check-config` checks too, by the same function.
        checked = preflight(config, token)
        # What the machine must give (a writable state dir, the probe socket's place, a
        # free listen address), before any part is built: a refusal is one line, exit 2.
        self.state_lock = check_machine(config)
        self.ctx = AgentContext(
            config=config,
            store=self.store,
            clock=clock,
            bus=EventBus(),
            tracer=self.tracer_provider.get_tracer("kcops.agent"),
            auth=TokenCheck(checked.token),
            state_dir=Path(config.agent.state_dir),
        )
        self.engine = Engine.configured_by(config.engine, checked.token, clock())
        pids = EnginePid(pid=config.engine.pid, pidfile=config.engine.pidfile)
        self.ticks = tick_histogram()
        self.collector_runner = CollectorRunner(
            self.store,
            collectors_pkg.build(self.ctx, self.ticks, self.engine, pids, REGEX_CACHE)
            + list(extra_collectors or []),
            timeout_s=min(0.8 * config.agent.tick_s, config.engine.timeout_s + 0.2),
        )
        # Tick order is the list order: collectors (health feeds the engine's lifecycle, the
        # process watcher reads exits), rules, incidents (their capture runs before a restart
        # asks for it), supervisor, remediation.
        self.components: list[Component] = [self.collector_runner]
        self.components += rules_pkg.build(self.ctx, checked.ruleset)
        parts = remediation_pkg.build(self.ctx, self.engine, pids, checked.ruleset)
        sup = cast("Supervisor | None", next((c for c in parts if c.name == "supervisor"), None))
        self.components += [incidents_pkg.build(self.ctx, self.engine, pids, sup), *parts]
        self.components += [QueryComponent(self.ctx), Recommender(self.ctx, self.engine)]
        self.components += build_metric_exporters(self.ctx, self.started_at)
        self.components += list(extra_components or [])
        self._stop = asyncio.Event()
        self._http: web.AppRunner | None = None
        self.bound_port: int | None = None
        # asyncio's failed accepts (EMFILE): counted and logged once a minute, not each second
        self.loop_errors = LoopErrors(log)

    # -- lifecycle -----------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    async def start(self) -> None:
        self.loop_errors.install(asyncio.get_running_loop())
        for comp in self.components:
            await comp.start()
        app = build_app()
        app.add_routes(core_routes(self))
        for comp in self.components:
            app.add_routes(comp.routes())
        self._http = JsonErrorRunner(app, error_body, access_log=None)
        await self._http.setup()
        host, port = self.config.agent.host_port()
        site = web.TCPSite(self._http, host, port)
        try:
            await site.start()
        except OSError as exc:
            await self._http.cleanup()
            raise ConfigError(
                f"agent.listen: cannot listen on {self.config.agent.listen}: {exc.strerror}"
            ) from None
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            self.bound_port = server.sockets[0].getsockname()[1]
        log.info("kcops agent %s listening on %s:%s", __version__, host, self.bound_port)

    async def tick_once(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        t0 = time.perf_counter()
        for comp in self.components:
            try:
                await comp.tick(now)
            except Exception:
                # A component bug must not stop the loop; collectors already
                # isolate themselves, this guards rules and actions.
                log.exception("component %s failed in tick", comp.name)
        elapsed = time.perf_counter() - t0
        self.ticks.observe(elapsed)
        own = [Sample.of("kcops_store_series", len(self.store)), *self.loop_errors.samples()]
        self.store.add(own, now)
        self.ticks_done += 1
        if self.ticks_done % EVICT_EVERY_TICKS == 0:
            self.store.evict(now)

    async def run(self, install_signals: bool = True) -> None:
        loop = asyncio.get_running_loop()
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.request_stop)
        tick_s = self.config.agent.tick_s
        # Ticks are stamped on an exact grid, wall0 + k * tick_s, as Prometheus
        # stamps rule evaluations: with wake-up jitter in the timestamps a rule's
        # `now - active_at >= for` can fall a few ms short and lose a whole tick.
        try:
            # Inside the try: a failed start still stops what did start, the supervised
            # engine first among them.
            await self.start()
            wall0, loop0, k = self.clock(), loop.time(), 0
            while not self._stop.is_set():
                stamp = wall0 + k * tick_s
                if abs(self.clock() - stamp) > tick_s / 2:
                    # The wall clock jumped (NTP step, suspend): re-anchor the grid.
                    wall0, loop0, k = self.clock(), loop.time(), 0
                    stamp = wall0
                await self.tick_once(now=stamp)
                k += 1
                if loop0 + k * tick_s < loop.time():
                    # Fell behind (slow tick): skip the missed ticks, keep the grid.
                    k = math.ceil((loop.time() - loop0) / tick_s)
                delay = max(0.0, loop0 + k * tick_s - loop.time())
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)
                except TimeoutError:
                    pass
        finally:
            await self.shutdown()
            if install_signals:
                for sig in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(sig)

    async def shutdown(self) -> None:
        """Stop components, the HTTP server and the tracer under one deadline."""
        deadline = self.config.agent.shutdown_deadline_s

        async def _all() -> None:
            for comp in reversed(self.components):
                try:
                    await comp.stop()
                except Exception:
                    log.exception("component %s failed to stop", comp.name)
            if self._http is not None:
                await self._http.cleanup()
                self._http = None
            await self.engine.aclose()

        try:
            await asyncio.wait_for(_all(), timeout=deadline)
        except TimeoutError:
            log.error("shutdown deadline of %.1fs passed; exiting anyway", deadline)
        # loop_errors stays: an accept retry asyncio scheduled before the close may fire
        # while the loop winds down
        remaining_ms = int(max(0.1, deadline / 2) * 1000)
        self.tracer_provider.force_flush(remaining_ms)
        self.tracer_provider.shutdown()
        self.state_lock.close()

    # -- status --------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        comps = {}
        for comp in self.components:
            try:
                comps[comp.name] = comp.status()
            except Exception as exc:
                comps[comp.name] = {"healthy": False, "error": f"{type(exc).__name__}: {exc}"}
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_s": round(self.clock() - self.started_at, 3),
            "ticks": self.ticks_done,
            "tick_s": self.config.agent.tick_s,
            "series": len(self.store),
            "mode": self.config.actions.mode,
            "engine_url": self.config.engine.url,
            "engine": self.engine.report(),
            "components": comps,
        }
