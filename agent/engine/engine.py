"""The engine as one object: its kind, admin routes, capabilities and lifecycle.

One :class:`Engine` per configured engine, built once by the app and handed to
the collectors (which feed it what they learn) and to remediation (which asks
it before every action). It resolves the kind once (``auto``: from the metrics
page, else by the registry's probes), keeps one shared HTTP client, and reads
routes and capabilities from the kind: nothing here names an engine. Refusals
are :class:`~kcops.agent.outcome.ActionRejected` (``not_configured``,
``unsupported``, ``starting``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from pydantic import JsonValue

from kcops.agent.engine import lifecycle as lc
from kcops.agent.engine.kinds import AUTO, Capabilities, EngineKind, EngineRegistry, builtin_kinds
from kcops.agent.engine.kinds.kind import WHAT, Routes
from kcops.agent.engine.lifecycle import EngineState, Lifecycle
from kcops.agent.httpclient import HttpClient, HttpError, HttpTimeout
from kcops.agent.outcome import ActionRejected, Refusal

if TYPE_CHECKING:
    from kcops.agent.config.engine import EngineSection

# What an admin route answers: its JSON, its text (first 300 chars), or None when empty.
Answer = dict[str, object] | list[object] | str | int | float | bool | None
JsonBody = dict[str, object]
# An admin route's JSON object; the actions read it through their own models.
Report = dict[str, object]

log = logging.getLogger("kcops.agent.engine")

IDENTIFY_EVERY_S = 10.0


class EngineFailed(RuntimeError):
    """The engine answered, and its answer says the operation did not happen."""


class Watch(Protocol):  # what the engine reads of the stall watch (engine/watch.py)
    def report(self) -> dict[str, object]: ...
    def evidence(self) -> dict[str, JsonValue]: ...


class Evidence(Protocol):  # what a restart asks of the incident records (agent/incidents)
    def current(self) -> str | None: ...
    async def keep(self, reason: str, now: float) -> str: ...


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
        registry: EngineRegistry | None = None,
    ) -> None:
        self.url = url.rstrip("/") if url else None
        self.registry = registry or builtin_kinds()
        self.configured = adapter
        self.kind: EngineKind | None = None if adapter == AUTO else self.registry.get(adapter)
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
        self._identified = False  # the kind known and its run-time extras (pause) probed
        # Set while a restart drains and stops the engine (why), so a load balancer
        # asking the agent's /api/v1/engine/ready stops sending it work.
        self.draining: str | None = None
        # The stall watch (progress and canary), when one runs: status and evidence.
        self.watch: Watch | None = None
        # The incident records, when kept: a restart keeps the evidence before any signal.
        self.incidents: Evidence | None = None
        self._identify_at = 0.0
        self._identifying: asyncio.Task[None] | None = None

    @classmethod
    def configured_by(cls, section: EngineSection, token: str | None, now: float) -> Engine:
        """The engine ``engine:`` configures (its admin calls get at least 5 s)."""
        return cls(
            section.url,
            section.adapter,
            token=token,
            timeout_s=max(5.0, section.timeout_s),
            now=now,
            startup_timeout_s=section.startup_timeout_s,
        )

    @property
    def http(self) -> HttpClient:
        """The shared client (aiohttp's), made on first use; it connects on first request."""
        if self._http is None:
            self._http = HttpClient(self.timeout_s)
        return self._http

    @property
    def headers(self) -> dict[str, str]:
        """Headers of every call to the engine (its bearer token, when one is set)."""
        return dict(self._headers)

    async def aclose(self) -> None:
        if self._identifying is not None and not self._identifying.done():
            self._identifying.cancel()
            await asyncio.gather(self._identifying, return_exceptions=True)
        if self._own_http and self._http is not None:
            await self._http.aclose()

    def identify_soon(self, now: float) -> None:
        """Find an auto-detected engine's kind and capabilities, off the caller's tick (an
        engine that does not answer must not hold the loop): tried at most every
        ``IDENTIFY_EVERY_S`` until known."""
        if self.url is None or self._identified or now < self._identify_at:
            return
        if self._identifying is not None and not self._identifying.done():
            return
        self._identify_at = now + IDENTIFY_EVERY_S
        self._identifying = asyncio.get_running_loop().create_task(self._identify())

    async def _identify(self) -> None:
        try:
            await self.resolve()
        except Exception as exc:  # not answering yet: tried again later
            log.debug("engine not identified yet: %s", exc)

    # -- identity and capabilities ---------------------------------------------

    @property
    def adapter(self) -> str | None:
        """The kind's name (label ``engine`` of its series); None until it is known."""
        return self.kind.name if self.kind is not None else None

    def learn(self, adapter: str) -> None:
        """The kind detected elsewhere (the scrape collector, from /metrics)."""
        if self.kind is None:
            self.kind = self.registry.get(adapter)
            log.info("engine at %s is %s", self.url, adapter)

    @property
    def capabilities(self) -> Capabilities | None:
        """What the engine can do; None until the kind is known."""
        return None if self.kind is None else (self._caps or self.kind.capabilities)

    async def resolve(self) -> str:
        """The kind's name, found once (asking the registry's probes when still unknown)."""
        base = self.need_url()
        if self.kind is None:
            for kind, path in self.registry.probes():
                try:
                    resp = await self.http.get(base + path, timeout_s=self.timeout_s)
                except HttpError:
                    continue
                if resp.status_code == 200:
                    self.learn(kind.name)
                    break
            else:
                raise ActionRejected(
                    f"cannot tell which engine answers at {base} yet; set engine.adapter",
                    Refusal.STARTING,
                )
        assert self.kind is not None
        if not self._identified:
            await self._probe_extras(base, self.kind)
        return self.kind.name

    async def _probe_extras(self, base: str, kind: EngineKind) -> None:
        table = kind.capabilities
        pause = kind.routes.pause
        if pause is not None:  # served only in some modes (vLLM: dev mode)
            try:
                resp = await self.http.get(base + pause.probe, timeout_s=self.timeout_s)
                table = table.with_pause(resp.status_code == 200)
            except HttpError:
                return  # not answering yet: probe again next time
        self._caps = table
        self._identified = True

    def _kind(self) -> EngineKind:
        assert self.kind is not None, "resolve() first"
        return self.kind

    def need_url(self) -> str:
        if not self.url:
            raise ActionRejected("engine.url is not configured", Refusal.NOT_CONFIGURED)
        return self.url

    def not_starting(self) -> None:
        """Refuse (reason ``starting``) while a tracked engine is still starting."""
        if self.tracked and self.state is EngineState.STARTING:
            raise ActionRejected(
                "the engine is still starting (not ready since it started at "
                f"{self.lifecycle.started_at:.0f})",
                Refusal.STARTING,
            )

    def require(self, what: str, *, policy: str | None = None) -> None:
        """Refuse (ActionRejected) unless the engine can do ``what``. Never does I/O."""
        self.need_url()
        have = self.capabilities
        if have is None:
            raise ActionRejected(
                f"the engine at {self.url} is not identified yet (adapter auto); "
                "set engine.adapter",
                Refusal.STARTING,
            )
        name = self.adapter
        if what == "evict":
            if policy not in have.evict:
                allowed = ", ".join(sorted(have.evict)) or "none"
                raise ActionRejected(
                    f"{name} cannot evict with policy {policy!r} (it can: {allowed})",
                    Refusal.UNSUPPORTED,
                )
            return
        if not getattr(have, what):
            raise ActionRejected(f"{name} has no {WHAT.get(what, what)}", Refusal.UNSUPPORTED)

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

    def report(self) -> dict[str, object]:
        """The engine section of the agent's status: its kind, lifecycle and progress."""
        return {
            "adapter": self.adapter,
            "state": self.state.value,
            "since": round(self.lifecycle.since, 3),
            "draining": self.draining,
            "progress": self.watch.report() if self.watch is not None else None,
        }

    def evidence(self) -> dict[str, JsonValue]:
        """Why the engine is judged as it is (for an audit record)."""
        return self.watch.evidence() if self.watch is not None else {"state": self.state.value}

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
        body: JsonBody | None = None,
        params: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Answer:
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
                f"{method} {path}: engine refused: {resp.text[:300]}", Refusal.ENGINE_REFUSED
            )
        if resp.status_code >= 400:
            raise EngineFailed(f"{method} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        if not resp.content:
            return None
        try:
            got: Answer = resp.json()
        except ValueError:
            return resp.text[:300]
        return got

    async def _route(self, what: str) -> str:
        """The path of admin route ``what`` (route, topn, state), refused where there is none."""
        await self.resolve()
        self.require(what)
        path: str | None = getattr(self._kind().routes, what)
        assert path is not None  # require() checked it
        return path

    async def state_doc(self) -> Report:
        path = await self._route("state")
        out = await self.call("GET", path)
        if not isinstance(out, dict):
            raise EngineFailed(f"GET {path}: not a JSON object: {str(out)[:200]}")
        return out

    async def evict(self, policy: str, fraction: float, *, drop_running: bool = False) -> Report:
        """Evict with ``policy``; raises EngineFailed when the engine says it did not."""
        name = await self.resolve()
        self.require("evict", policy=policy)
        route = self._kind().routes.evict
        assert route is not None  # require("evict") checked it
        if route.policy_body:
            out = await self.call("POST", route.path, {"policy": policy, "fraction": fraction})
            return _report(out)
        params = None
        if route.drop_running_param is not None:
            have = self.capabilities
            drop = drop_running and have is not None and have.drop_running
            params = {route.drop_running_param: "true" if drop else "false"}
        out = await self.call("POST", route.path, params=params)
        # vLLM 0.32 answers 200 {"success": false} when blocks are still in use.
        if isinstance(out, dict) and out.get("success") is False:
            raise EngineFailed(
                f"{name} {route.path} answered success=false: the cache was not reset "
                "(blocks still held by running requests)"
            )
        return {"policy": "all", "route": route.path, "response": out}

    async def set_route(self, mode: str) -> Report:
        return _report(await self.call("POST", await self._route("route"), {"mode": mode}))

    async def set_topn(self, top_n: int) -> Report:
        return _report(await self.call("POST", await self._route("topn"), {"top_n": top_n}))

    async def admission_control(self) -> str | None:
        """How this engine stops admitting new work: ``drain`` (kcops worker), ``pause``
        (vLLM in dev mode), or None (it cannot; vLLM then relies on its own drain on
        SIGTERM, ``--shutdown-timeout``). None too while the engine is not identified."""
        try:
            await self.resolve()
        except ActionRejected:
            return None
        have = self.capabilities or Capabilities()
        return "drain" if have.drain else "pause" if have.pause else None

    async def stop_admitting(self, deadline_s: float) -> str | None:
        """Stop new work: kcops drain, vLLM /pause (dev mode). Returns how, or None.

        vLLM's ``/pause?mode=wait`` stops admitting and answers once running
        requests finished: it is the drain itself, so it gets the drain deadline.
        """
        how = await self.admission_control()
        routes = self._kind().routes if how is not None else Routes()
        if how == "drain" and routes.drain is not None:
            await self.call("POST", routes.drain, {"admit": False})
        elif how == "pause" and routes.pause is not None:
            p = routes.pause
            try:
                await self.call("POST", p.pause, params=dict(p.pause_params), timeout_s=deadline_s)
            except HttpTimeout:
                log.warning(
                    "%s %s: requests still running after %.0fs", self.adapter, p.pause, deadline_s
                )
        return how

    async def resume_admitting(self, how: str | None) -> None:
        routes = self.kind.routes if self.kind is not None else Routes()
        if how == "drain" and routes.drain is not None:
            await self.call("POST", routes.drain, {"admit": True})
        elif how == "pause" and routes.pause is not None:
            await self.call("POST", routes.pause.resume)

    async def in_flight(self) -> int | None:
        """Requests in flight by the admin state, where there is one; else None."""
        have = self.capabilities
        if have is None or not have.state:
            return None
        got = (await self.state_doc()).get("in_flight")
        return int(got) if isinstance(got, int) and not isinstance(got, bool) else None


def _report(answer: Answer) -> Report:
    """An admin route's answer as a JSON object (a non-object one under ``response``)."""
    return answer if isinstance(answer, dict) else {"response": answer}
