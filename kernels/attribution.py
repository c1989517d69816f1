"""Attributing the probe's K(C) rows to the requests they belong to.

An engine that knows which request each batch entry of a forward pass serves
says so with :func:`attribute` around the forward; the probe reads
:func:`current` when it measures a sampled call and adds each recomputed row's
K_p to the :class:`RequestKC` of its batch entry. Torch-free; costs one context
variable read per sampled call, nothing on other calls.

Which figure a request keeps (docs/kc.md "Effective context and
cost"): the **mean** over its sampled rows (every layer, every sampled step) of
``k_union`` at the probe's first p. The mean, not the max, because a KV budget
is paid by every layer at every step (the KV held is the sum over layers of the
keys kept, so the mean over layers times L is the total), and because a max
grows with the number of samples, so it would depend on the sampling rate and
on the request's length rather than on its traffic.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar


class RequestKC:
    """The K(C) samples of one request: count, sum and max of K_p (tokens)."""

    __slots__ = ("count", "peak", "total")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.peak = 0

    def add(self, k: int) -> None:
        self.count += 1
        self.total += k
        if k > self.peak:
            self.peak = k

    @property
    def mean(self) -> float | None:
        """Mean K_p over the samples; None when the probe sampled none of its rows."""
        return self.total / self.count if self.count else None


Rows = tuple[RequestKC | None, ...]
Resolve = Callable[[], Sequence[RequestKC | None] | None]

# Batch entry b of the current forward pass serves requests[b] (None: not attributed), or
# a function that says so when asked (attribute_lazily).
_ROWS: ContextVar[Rows | Resolve | None] = ContextVar("kcops_kc_rows", default=None)


@contextlib.contextmanager
def attribute(requests: Sequence[RequestKC | None]) -> Iterator[None]:
    """Within the block, batch entry ``b`` of attention calls belongs to ``requests[b]``."""
    token = _ROWS.set(tuple(requests))
    try:
        yield
    finally:
        _ROWS.reset(token)


@contextlib.contextmanager
def attribute_lazily(resolve: Resolve) -> Iterator[None]:
    """Like :func:`attribute`, for an engine that builds its batch inside the block (vLLM's
    model runner): ``resolve()`` is called only when a sampled call reads :func:`current`,
    so unsampled calls cost nothing. It returns None when it cannot say."""
    token = _ROWS.set(resolve)
    try:
        yield
    finally:
        _ROWS.reset(token)


def current() -> Rows | None:
    """The requests of the current forward's batch entries, or None when nobody said."""
    rows = _ROWS.get()
    if callable(rows):
        got = rows()
        return None if got is None else tuple(got)
    return rows
