"""One HTTP poll of the engine per tick, shared by the scrape and health collectors.

The collector runner runs collectors one after the other, so a hung engine
would cost each HTTP collector its full timeout. :meth:`EngineClient.poll`
instead fires ``/health``, ``/metrics`` (and, for the kcops worker, now and
then ``/admin/state``) concurrently once per ``now`` and hands the same result
to every caller: a hung engine costs one timeout per tick, not two.
Every request runs under a total deadline (``timeout_s``), not only httpx's
per-read timeout, so a server that trickles bytes cannot hold the tick.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kcops.agent.collectors.enginepid import EnginePid

if TYPE_CHECKING:
    import httpx

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


class _TooLarge(Exception):
    pass


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
        http: httpx.AsyncClient | None = None,
        pids: EnginePid | None = None,
        state_interval_s: float = 5.0,
    ) -> None:
        # httpx logs every request at INFO: one line per tick per endpoint drowns the
        # agent's log. Quiet it unless someone configured that logger on purpose.
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
        self.want_state = False  # set by the scrape collector when the engine is the kcops worker
        self._task: asyncio.Future[Poll] | None = None
        self._task_now: float | None = None
        self._state_next_at = 0.0

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            import httpx  # ~7 MiB of RSS: imported once an engine is polled

            self._http = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s),
                limits=httpx.Limits(max_connections=4, max_keepalive_connections=4),
                trust_env=False,
            )
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
        import httpx

        url = self.base_url + path
        try:
            async with self.http.stream("GET", url, timeout=self.timeout_s) as r:
                chunks = []
                size = 0
                async for chunk in r.aiter_bytes():
                    size += len(chunk)
                    if size > limit:
                        raise _TooLarge
                    chunks.append(chunk)
                body = b"".join(chunks)
        except _TooLarge:
            return Fetch(False, reason="too_large", error=f"{url}: body over {limit} bytes")
        except httpx.TimeoutException:
            return Fetch(
                False, reason="timeout", error=f"{url}: no answer within {self.timeout_s}s"
            )
        except httpx.ConnectError as exc:
            return Fetch(False, reason="connect", error=f"{url}: cannot connect ({exc})")
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            return Fetch(False, reason="protocol", error=f"{url}: {type(exc).__name__}: {exc}")
        except httpx.HTTPError as exc:
            return Fetch(False, reason="http_error", error=f"{url}: {type(exc).__name__}: {exc}")
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
