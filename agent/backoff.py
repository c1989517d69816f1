"""Errors that can repeat: a back-off before the next try, and a log that does not flood.

An error a socket can raise again at once (``accept`` with no file descriptor left,
EMFILE/ENFILE) must never be retried at once: with the listening socket still
readable, that was a busy loop (100% CPU, over 100 MB of log in ten seconds, a silent
control API). :class:`Backoff` is the wait before the next try; :class:`RepeatLog` logs
the first occurrence of a kind, then at most once per ``interval_s`` with the count;
:class:`LoopErrors` applies both to the event loop's own accept loop (aiohttp's
server), which asyncio retries after 1 s, with a traceback each time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from kcops.agent.samples import Sample

LOG_EVERY_S = 60.0
# asyncio's message for an accept that failed for want of a resource (it backs off 1 s)
ACCEPT_OUT_OF_RESOURCE = "socket.accept() out of system resource"
Handler = Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object]


class Backoff:
    """Seconds to wait before the next try: ``first_s``, doubling to ``max_s``."""

    def __init__(self, first_s: float = 0.1, max_s: float = 2.0) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.delay_s = 0.0

    def next(self) -> float:
        self.delay_s = min(max(self.first_s, 2 * self.delay_s), self.max_s)
        return self.delay_s

    def reset(self) -> None:
        self.delay_s = 0.0


class RepeatLog:
    """Logs an error of a kind the first time, then at most once per ``interval_s``, with
    how many times it happened since the last line; counts every occurrence."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self.counts: dict[str, int] = {}  # every occurrence, by kind
        self._last: dict[str, tuple[float, int]] = {}  # kind: (when logged, count then)

    def __call__(self, kind: str, level: int, msg: str, *args: object) -> bool:
        """Count one ``kind``; log ``msg % args`` if its interval has passed. True if logged."""
        n = self.counts[kind] = self.counts.get(kind, 0) + 1
        now = self.clock()
        last = self._last.get(kind)
        if last is not None and now - last[0] < self.interval_s:
            return False
        self._last[kind] = (now, n)
        if last is None:
            self.logger.log(level, msg, *args)
        else:
            since = n - last[1]
            self.logger.log(
                level, msg + " (%d times in the last %.0f s)", *args, since, now - last[0]
            )
        return True


class LoopErrors:
    """The agent loop's exception handler: asyncio's report of a failed accept (it retries
    after 1 s) is counted as ``kcops_collector_errors_total{collector="http",
    reason="accept"}`` and logged by :class:`RepeatLog`; that retry, when it fires after
    the server closed, is a debug line; anything else goes to the loop's default handler,
    as before."""

    def __init__(self, logger: logging.Logger, interval_s: float = LOG_EVERY_S) -> None:
        self.log = RepeatLog(logger, interval_s)
        self._before: Handler | None = None

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        self._before = loop.get_exception_handler()
        loop.set_exception_handler(self)

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        if loop.get_exception_handler() is self:
            loop.set_exception_handler(self._before)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message, exc = str(context.get("message", "")), context.get("exception")
        if message.startswith(ACCEPT_OUT_OF_RESOURCE):
            self.log("accept", logging.WARNING, "HTTP server: accept failed (asyncio retries "
                     "in 1 s): %s", exc)  # fmt: skip
        elif "._start_serving(" in message and isinstance(exc, ValueError):
            # that retry, still pending when the server closed, finds its socket gone
            self.log.logger.debug("HTTP server: an accept retry after the close: %s", exc)
        elif self._before is not None:
            self._before(loop, context)
        else:
            loop.default_exception_handler(context)

    def samples(self) -> list[Sample]:
        return [
            Sample.of("kcops_collector_errors_total", float(n), {"collector": "http", "reason": k})
            for k, n in self.log.counts.items()
        ]
