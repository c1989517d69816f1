"""The collector interface and the runner that isolates collector failures.

A collector is any object with a ``name`` and ``collect(now)`` returning
samples (or an awaitable of them, for collectors that do network I/O). It
raises :class:`~kcops.errors.CollectorUnavailable` when its source
cannot be read; anything else it raises is a bug, counted just the same so
that one broken collector never stops the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from kcops.agent.samples import Sample, SeriesKey
from kcops.agent.store import Store
from kcops.errors import CollectorUnavailable

log = logging.getLogger("kcops.agent.collectors")


class Collector(Protocol):
    """A source of samples. The store counts its new series against the budget of
    ``source_of`` when it has one (a string, or a function of a series' labels: the
    probe's, by process), else of ``name``."""

    name: str

    def collect(self, now: float) -> Iterable[Sample] | Awaitable[Iterable[Sample]]:
        """Read the source once. Timestamps default to ``now``."""
        ...


@dataclass
class CollectorHealth:
    ok: bool = False
    last_error: str | None = None
    last_success: float | None = None
    errors: int = 0
    runs: int = 0
    last_duration_s: float = 0.0
    series: int = 0


class CollectorRunner:
    """Runs every collector each tick and writes what they return into the store.

    - a failing collector increments ``kcops_collector_errors_total{collector,reason}``
      and its previous series get staleness markers (as a failed Prometheus
      scrape does), so rules see them as absent, not as frozen values;
    - a series a collector stops returning also gets a staleness marker;
    - an async collector that runs past ``timeout_s`` counts as reason="timeout".
    """

    name = "collectors"

    def __init__(self, store: Store, collectors: list[Collector], timeout_s: float = 0.8) -> None:
        self.store = store
        self.collectors = list(collectors)
        self.timeout_s = timeout_s
        self.health: dict[str, CollectorHealth] = {c.name: CollectorHealth() for c in collectors}
        self._errors: dict[tuple[str, str], int] = {}
        self._last_keys: dict[str, set[SeriesKey]] = {c.name: set() for c in collectors}
        self._started: list[Any] = []

    async def start(self) -> None:
        for c in self.collectors:
            start = getattr(c, "start", None)
            if start is not None:
                res = start()
                if inspect.isawaitable(res):
                    await res
            self._started.append(c)

    async def stop(self) -> None:
        for c in reversed(self._started):
            stop = getattr(c, "stop", None)
            if stop is None:
                continue
            try:
                res = stop()
                if inspect.isawaitable(res):
                    await res
            except Exception:
                log.exception("collector %s failed to stop", c.name)

    async def _run_one(self, c: Collector, now: float) -> list[Sample]:
        res = c.collect(now)
        if inspect.isawaitable(res):
            res = await asyncio.wait_for(res, timeout=self.timeout_s)
        return list(res)  # type: ignore[arg-type]

    async def tick(self, now: float) -> None:
        for c in self.collectors:
            h = self.health[c.name]
            h.runs += 1
            t0 = time.perf_counter()
            try:
                samples = await self._run_one(c, now)
            except CollectorUnavailable as exc:
                self._fail(c.name, exc.reason, str(exc), now)
            except TimeoutError:
                self._fail(c.name, "timeout", f"no answer within {self.timeout_s}s", now)
            except Exception as exc:
                message = f"{type(exc).__name__}: {exc}"
                if h.last_error != message:  # a traceback each tick would flood the log
                    log.exception("collector %s raised", c.name)
                self._fail(c.name, "exception", message, now)
            else:
                keys = self.store.write(samples, now, getattr(c, "source_of", c.name))
                for gone in self._last_keys[c.name] - keys:
                    self.store.mark_stale(gone, now)
                self._last_keys[c.name] = keys
                h.ok, h.last_error, h.last_success, h.series = True, None, now, len(keys)
            finally:
                h.last_duration_s = time.perf_counter() - t0
        self._emit_own(now)

    def _fail(self, name: str, reason: str, message: str, now: float) -> None:
        h = self.health[name]
        if h.last_error != message:
            log.warning("collector %s: %s", name, message)
        h.ok, h.last_error = False, message
        h.errors += 1
        self._errors[(name, reason)] = self._errors.get((name, reason), 0) + 1
        for gone in self._last_keys[name]:
            self.store.mark_stale(gone, now)
        self._last_keys[name] = set()

    def _emit_own(self, now: float) -> None:
        samples = [
            Sample.of("kcops_collector_errors_total", n, {"collector": c, "reason": r})
            for (c, r), n in self._errors.items()
        ]
        samples += [
            Sample.of("kcops_collector_up", 1.0 if h.ok else 0.0, {"collector": name})
            for name, h in self.health.items()
        ]
        self.store.add(samples, now)

    def status(self) -> dict[str, Any]:
        return {
            "healthy": all(h.ok for h in self.health.values()),
            "collectors": {
                name: {
                    "ok": h.ok,
                    "error": h.last_error,
                    "errors": h.errors,
                    "runs": h.runs,
                    "last_success": h.last_success,
                    "series": h.series,
                    "last_duration_s": round(h.last_duration_s, 6),
                }
                for name, h in self.health.items()
            },
        }

    def routes(self) -> list[web.RouteDef]:
        return []


class InThread:
    """Runs a synchronous collector in its own thread, one call at a time.

    For sources that can hang inside a C library (NVML when a GPU falls off the
    bus): the loop awaits with the runner's timeout and goes on; while a call is
    still stuck, later ticks report ``reason="hung"`` instead of piling up threads.
    ``start``/``stop`` of the wrapped collector are passed through.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self._pending: asyncio.Future[Any] | None = None

    async def start(self) -> None:
        start = getattr(self.inner, "start", None)
        if start is not None:
            res = start()
            if inspect.isawaitable(res):
                await res

    async def stop(self) -> None:
        stop = getattr(self.inner, "stop", None)
        if stop is not None and (self._pending is None or self._pending.done()):
            res = stop()
            if inspect.isawaitable(res):
                await res

    async def collect(self, now: float) -> Iterable[Sample]:
        if self._pending is not None and not self._pending.done():
            raise CollectorUnavailable(
                f"{self.name}: the previous read has not returned yet", reason="hung"
            )
        loop = asyncio.get_running_loop()
        self._pending = loop.run_in_executor(None, self.inner.collect, now)
        # A read that outlives this tick's timeout may still end in an error: take it here,
        # or asyncio logs "Future exception was never retrieved" with a traceback.
        self._pending.add_done_callback(_late_outcome)
        # shield: a timeout of this tick must not orphan the result of the read.
        return list(await asyncio.shield(self._pending))


def _late_outcome(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.debug("a collector read ended after its tick: %s", fut.exception())
