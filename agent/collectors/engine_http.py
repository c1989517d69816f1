"""One HTTP poll of the engine per tick, shared by the scrape and health collectors.

The collector runner runs collectors one after the other, so a hung engine
would cost each HTTP collector its full timeout. :meth:`EngineClient.poll`
instead fires ``/health``, ``/metrics`` (and, for the kcops worker, now and
then ``/admin/state``) concurrently once per ``now`` and hands the same result
to every caller: a hung engine costs one timeout per tick, not two. Every
request runs under a total deadline, so a server that trickles bytes cannot
hold the tick.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from kcops.agent.engine.pid import EnginePid
from kcops.agent.httpclient import HttpClient, HttpError

log = logging.getLogger("kcops.agent.collectors.engine_http")


@dataclass(frozen=True)
class Fetch:
    """The outcome of one GET: ``body`` when it answered 2xx, else ``reason`` and ``error``."""

    ok: bool
    status: int | None = None
    body: bytes = b""
    content_type: str = ""
    reason: str = ""  # timeout | connect | http_status | too_large | protocol
    error: str = ""
    elapsed_s: float = 0.0


@dataclass(frozen=True)
class Poll:
    health: Fetch | None
    metrics: Fetch | None


class EngineClient:
    def __init__(
        self,
        base_url: str,
        *,
        metrics_path: str = "/metrics",
        health_path: str = "/health",
        state_path: str = "/admin/state",
        timeout_s: float = 0.5,
        max_body_bytes: int = 8 << 20,
        http: HttpClient | None = None,
        pids: EnginePid | None = None,
        state_interval_s: float = 5.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.metrics_path = metrics_path
        self.health_path = health_path
        self.state_path = state_path
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._http = http
        self._own_http = http is None
        self.pids = pids
        self.state_interval_s = state_interval_s
        # Which parts to fetch; set by the collectors that use them.
        self.want_health = False
        self.want_metrics = False
        # Set by the scrape collector when the engine kind has an admin state route (kcops).
        self.want_state = False
        self._task: asyncio.Future[Poll] | None = None
        self._task_now: float | None = None
        self._state_next_at = 0.0

    @property
    def http(self) -> HttpClient:
        if self._http is None:
            self._http = HttpClient(self.timeout_s)
        return self._http

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._own_http and self._http is not None:
            await self._http.aclose()
            self._http = None

    async def poll(self, now: float) -> Poll:
        """The engine's answers for tick ``now`` (one set of requests per ``now``)."""
        if self._task is None or self._task_now != now:
            if self._task is not None and not self._task.done():
                self._task.cancel()
            self._task_now = now
            self._task = asyncio.ensure_future(self._poll(now))
        # shield: a caller cancelled by its own timeout must not cancel the shared poll.
        return await asyncio.shield(self._task)

    async def _poll(self, now: float) -> Poll:
        jobs = []
        if self.want_health:
            jobs.append(self.fetch(self.health_path))
        if self.want_metrics:
            jobs.append(self.fetch(self.metrics_path, limit=self.max_body_bytes))
        state = self.want_state and self.pids is not None and now >= self._state_next_at
        if state:
            self._state_next_at = now + self.state_interval_s
            jobs.append(self.fetch(self.state_path, limit=1 << 20))
        results = list(await asyncio.gather(*jobs))
        health = results.pop(0) if self.want_health else None
        metrics = results.pop(0) if self.want_metrics else None
        if state:
            self._take_state(results.pop(0))
        return Poll(health, metrics)

    def _take_state(self, f: Fetch) -> None:
        if not f.ok or self.pids is None:
            return
        try:
            pid = json.loads(f.body).get("pid")
        except (ValueError, AttributeError):
            return
        if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0:
            self.pids.observed = pid

    async def fetch(self, path: str, limit: int = 1 << 16) -> Fetch:
        """GET ``path`` under the total deadline; never raises for network trouble."""
        t0 = time.perf_counter()
        try:
            return await asyncio.wait_for(self._get(path, limit, t0), timeout=self.timeout_s)
        except TimeoutError:
            return Fetch(
                False,
                reason="timeout",
                error=f"no answer within {self.timeout_s}s",
                elapsed_s=time.perf_counter() - t0,
            )

    async def _get(self, path: str, limit: int, t0: float) -> Fetch:
        url = self.base_url + path
        try:
            r = await self.http.get(url, timeout_s=self.timeout_s, limit=limit)
        except HttpError as exc:
            return Fetch(False, reason=exc.reason, error=str(exc))
        body = r.content
        elapsed = time.perf_counter() - t0
        ctype = r.headers.get("content-type", "")
        if not 200 <= r.status_code < 300:
            return Fetch(
                False,
                r.status_code,
                body,
                ctype,
                reason="http_status",
                error=f"{url}: HTTP {r.status_code}",
                elapsed_s=elapsed,
            )
        return Fetch(True, r.status_code, body, ctype, elapsed_s=elapsed)
