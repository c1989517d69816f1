"""The engine as one object: adapter, admin routes, capabilities and lifecycle.

One :class:`Engine` per configured engine, built once by the app and handed to
the collectors (which feed it what they learn: the adapter detected from
``/metrics``, the health answer of each tick) and to remediation (which asks
it before every action). It resolves the adapter once (``auto``: from the
metrics page, else by probing admin routes), keeps one shared HTTP client,
and turns each capability into data (:mod:`kcops.agent.engine.capabilities`).

Refusals are :class:`~kcops.errors.ActionRejected` with a reason code
the runner records in the audit log: ``not_configured`` (no ``engine.url``),
``unsupported`` (the engine lacks the capability), ``starting`` (the engine
is loading or not identified yet).
"""

from __future__ import annotations

import logging
from typing import Any

from kcops.agent.engine import capabilities as caps
from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine.capabilities import Capabilities
from kcops.agent.engine.lifecycle import EngineState, Lifecycle
from kcops.agent.httpclient import HttpClient, HttpError, HttpTimeout
from kcops.errors import ActionRejected

log = logging.getLogger("kcops.agent.engine")

# Probed in this order when adapter is auto and /metrics has not told us yet.
PROBES = (("kcops", "/admin/state"), ("sglang", "/get_server_info"), ("vllm", "/version"))
RESET_ROUTES = {"vllm": "/reset_prefix_cache", "sglang": "/flush_cache"}
# vLLM serves /pause, /resume and /is_paused only with VLLM_SERVER_DEV_MODE=1.
VLLM_DEV_PROBE = "/is_paused"


class EngineFailed(RuntimeError):
    """The engine answered, and its answer says the operation did not happen."""


class Engine:
    """One configured engine. ``url`` None means none is configured."""

    def __init__(
        self,
        url: str | None,
        adapter: str = "auto",
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
        http: HttpClient | None = None,
        now: float = 0.0,
        startup_timeout_s: float = 600.0,
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.configured = adapter
        self.adapter: str | None = None if adapter == "auto" else adapter
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._own_http = http is None
        self._http = http
        self._caps: Capabilities | None = None
        self.lifecycle: Lifecycle = lc.initial(now)
        # True once something feeds the lifecycle (the health collector): without
        # health checks the state is unknown and never holds an action back.
        self.tracked = False
        self._probed_dev_mode = False
        # Set while a restart drains and stops the engine (why), so a load balancer
        # asking the agent's /api/v1/engine/ready stops sending it work.
        self.draining: str | None = None

    @property
    def http(self) -> HttpClient:
        """The shared client (aiohttp's), made on first use; it connects on first request."""
        if self._http is None:
            self._http = HttpClient(self.timeout_s)
        return self._http

    async def aclose(self) -> None:
        if self._own_http and self._http is not None:
            await self._http.aclose()

    # -- identity and capabilities ---------------------------------------------

    def learn(self, adapter: str) -> None:
        """The adapter detected elsewhere (the scrape collector, from /metrics)."""
        if self.adapter is None:
            self.adapter = adapter
            log.info("engine at %s is %s", self.url, adapter)

    @property
    def capabilities(self) -> Capabilities | None:
        """What the engine can do; None until the adapter is known."""
        if self.adapter is None:
            return None
        return self._caps if self._caps is not None else caps.of(self.adapter)

    async def resolve(self) -> str:
        """The adapter name, found once (probing admin routes when still unknown)."""
        base = self.need_url()
        if self.adapter is None:
            for name, path in PROBES:
                try:
                    resp = await self.http.get(base + path, timeout_s=self.timeout_s)
                except HttpError:
                    continue
                if resp.status_code == 200:
                    self.learn(name)
                    break
            else:
                raise ActionRejected(
                    f"cannot tell which engine answers at {base} yet; set engine.adapter",
                    "starting",
                )
        assert self.adapter is not None
        if not self._probed_dev_mode:
            await self._probe_extras(base)
        return self.adapter

    async def _probe_extras(self, base: str) -> None:
        table = caps.of(self.adapter or "")
        if self.adapter == "vllm":
            try:
                resp = await self.http.get(base + VLLM_DEV_PROBE, timeout_s=self.timeout_s)
                table = table.with_pause(resp.status_code == 200)
            except HttpError:
                return  # not answering yet: probe again next time
        self._caps = table
        self._probed_dev_mode = True

    @property
    def capabilities_probed(self) -> bool:
        """True once the engine-specific extras (vLLM dev mode) were probed."""
        return self._probed_dev_mode

    def need_url(self) -> str:
        if not self.url:
            raise ActionRejected("engine.url is not configured", "not_configured")
        return self.url

    def not_starting(self) -> None:
        """Refuse (reason ``starting``) while a tracked engine is still starting."""
        if self.tracked and self.state is EngineState.STARTING:
            raise ActionRejected(
                "the engine is still starting (not ready since it started at "
                f"{self.lifecycle.started_at:.0f})",
                "starting",
            )

    def require(self, what: str, *, policy: str | None = None) -> None:
        """Refuse (ActionRejected) unless the engine can do ``what``. Never does I/O."""
        self.need_url()
        have = self.capabilities
        if have is None:
            raise ActionRejected(
                f"the engine at {self.url} is not identified yet (adapter auto); "
                "set engine.adapter",
                "starting",
            )
        name = self.adapter
        if what == "evict":
            if policy not in have.evict:
                allowed = ", ".join(sorted(have.evict)) or "none"
                raise ActionRejected(
                    f"{name} cannot evict with policy {policy!r} (it can: {allowed})",
                    "unsupported",
                )
            return
        if not getattr(have, what):
            raise ActionRejected(f"{name} has no {caps.WHAT.get(what, what)}", "unsupported")

    # -- lifecycle --------------------------------------------------------------

    @property
    def state(self) -> EngineState:
        return self.lifecycle.state

    def observe(self, ev: lc.Event) -> None:
        if isinstance(ev, lc.Health):
            self.tracked = True
        before = self.lifecycle.state
        self.lifecycle = lc.step(self.lifecycle, ev)
        if self.lifecycle.state is not before:
            log.info("engine %s -> %s", before, self.lifecycle.state)

    def serving(self) -> bool:
        """True while the engine takes work: ready (by its health checks), not draining."""
        return self.tracked and self.state is EngineState.READY and self.draining is None

    def starting_overrun_s(self, now: float) -> float | None:
        """Seconds the current start has lasted, while starting; None otherwise."""
        if self.state is not EngineState.STARTING:
            return None
        return max(0.0, now - self.lifecycle.started_at)

    # -- admin calls ------------------------------------------------------------

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One admin call; HTTP 400 raises ActionRejected, other >= 400 EngineFailed."""
        base = self.need_url()
        resp = await self.http.request(
            method,
            base + path,
            json=body,
            params=params,
            headers=self._headers,
            timeout_s=self.timeout_s if timeout_s is None else timeout_s,
        )
        if resp.status_code == 400:
            raise ActionRejected(
                f"{method} {path}: engine refused: {resp.text[:300]}", "engine_refused"
            )
        if resp.status_code >= 400:
            raise EngineFailed(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            return resp.text[:300]

    async def state_doc(self) -> dict[str, Any]:
        await self.resolve()
        self.require("state")
        out = await self.call("GET", "/admin/state")
        if not isinstance(out, dict):
            raise EngineFailed(f"GET /admin/state: not a JSON object: {str(out)[:200]}")
        return out

    async def evict(
        self, policy: str, fraction: float, *, drop_running: bool = False
    ) -> dict[str, Any]:
        """Evict with ``policy``; raises EngineFailed when the engine says it did not."""
        adapter = await self.resolve()
        self.require("evict", policy=policy)
        if adapter == "kcops":
            out = await self.call(
                "POST", "/admin/cache/evict", {"policy": policy, "fraction": fraction}
            )
            return out if isinstance(out, dict) else {"response": out}
        route = RESET_ROUTES[adapter]
        params = None
        if adapter == "vllm":
            have = self.capabilities
            drop = drop_running and have is not None and have.drop_running
            params = {"reset_running_requests": "true" if drop else "false"}
        out = await self.call("POST", route, params=params)
        # vLLM 0.32 answers 200 {"success": false} when blocks are still in use.
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineFailed(
                f"{adapter} {route} answered success=false: the cache was not reset "
                "(blocks still held by running requests)"
            )
        return {"policy": "all", "route": route, "response": out}

    async def set_route(self, mode: str) -> dict[str, Any]:
        await self.resolve()
        self.require("route")
        out = await self.call("POST", "/admin/route", {"mode": mode})
        return out if isinstance(out, dict) else {"response": out}

    async def set_topn(self, top_n: int) -> dict[str, Any]:
        await self.resolve()
        self.require("topn")
        out = await self.call("POST", "/admin/attention", {"top_n": top_n})
        return out if isinstance(out, dict) else {"response": out}

    async def admission_control(self) -> str | None:
        """How this engine stops admitting new work: ``drain`` (kcops worker), ``pause``
        (vLLM in dev mode), or None (it cannot; vLLM then relies on its own drain on
        SIGTERM, ``--shutdown-timeout``). None too while the engine is not identified."""
        try:
            await self.resolve()
        except ActionRejected:
            return None
        have = self.capabilities
        if have is not None and have.drain:
            return "drain"
        if have is not None and have.pause:
            return "pause"
        return None

    async def stop_admitting(self, deadline_s: float) -> str | None:
        """Stop new work: kcops drain, vLLM /pause (dev mode). Returns how, or None.

        vLLM's ``/pause?mode=wait`` stops admitting and answers once running
        requests finished: it is the drain itself, so it gets the drain deadline.
        """
        how = await self.admission_control()
        if how == "drain":
            await self.call("POST", "/admin/drain", {"admit": False})
        elif how == "pause":
            try:
                await self.call("POST", "/pause", params={"mode": "wait"}, timeout_s=deadline_s)
            except HttpTimeout:
                log.warning("vllm /pause: running requests not done within %.0fs", deadline_s)
        return how

    async def resume_admitting(self, how: str | None) -> None:
        if how == "drain":
            await self.call("POST", "/admin/drain", {"admit": True})
        elif how == "pause":
            await self.call("POST", "/resume")

    async def in_flight(self) -> int | None:
        """Requests in flight by the admin state, where there is one; else None."""
        have = self.capabilities
        if have is None or not have.state:
            return None
        got = (await self.state_doc()).get("in_flight")
        return int(got) if isinstance(got, int) and not isinstance(got, bool) else None
