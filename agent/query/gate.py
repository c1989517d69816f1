"""The query API's share of the event loop: a bound on concurrent queries and on loop time.

Queries are evaluated on the agent's event loop, so what bounds them must bound
the loop time they take together, not only each one: 32 queries arriving
together, each within its own 1 s budget, once held the loop for 32 s and
stopped the ticks. So ``/api/v1/query`` and ``/api/v1/query_range`` get at most
:data:`MAX_CONCURRENT` queries in flight, and at most :data:`SHARE_S` seconds of
loop time per :data:`WINDOW_S` together (a bucket that refills at that rate).
Past the first, or arriving with the bucket empty, a query is answered 503
``unavailable`` at once; one that runs the bucket dry stops with 503 ``timeout``.
The ticks and the control API keep at least ``WINDOW_S - SHARE_S`` of every
window, however many queries arrive (refusals: ``kcops_query_refused_total``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

MAX_CONCURRENT = 8
WINDOW_S = 1.0
SHARE_S = 0.5


class QueryUnavailable(Exception):
    """Refused before evaluation: too many queries, or the loop share is spent."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class QueryGate:
    """Admits queries; :meth:`admit` yields the deadline their evaluation must keep."""

    def __init__(
        self,
        max_concurrent: int = MAX_CONCURRENT,
        window_s: float = WINDOW_S,
        share_s: float = SHARE_S,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.window_s = window_s
        self.share_s = share_s
        self.in_flight = 0
        self.refused: dict[str, int] = {"concurrency": 0, "loop_share": 0}
        # A token bucket of loop time: it refills at share_s per window_s, up to share_s.
        self._tokens = share_s
        self._at = time.perf_counter()

    def _left(self, now: float) -> float:
        rate = self.share_s / self.window_s
        self._tokens = min(self.share_s, self._tokens + (now - self._at) * rate)
        self._at = now
        return self._tokens

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Hold one of the concurrent places while a query is read and evaluated."""
        if self.in_flight >= self.max_concurrent:
            self.refused["concurrency"] += 1
            raise QueryUnavailable(
                "concurrency",
                f"too many concurrent queries (at most {self.max_concurrent}); retry shortly",
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    @contextmanager
    def evaluation(self) -> Iterator[float]:
        """The deadline (``time.perf_counter()`` s) of one evaluation; its time is counted."""
        t0 = time.perf_counter()
        left = self._left(t0)
        if left <= 0:
            self.refused["loop_share"] += 1
            raise QueryUnavailable(
                "loop_share",
                f"the query API's share of the agent's event loop ({self.share_s:g}s per "
                f"{self.window_s:g}s) is spent; retry shortly",
            )
        try:
            yield t0 + left
        finally:
            t1 = time.perf_counter()
            self._left(t1)
            self._tokens -= t1 - t0
