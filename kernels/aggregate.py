"""In-process aggregation of what the probe sees between two flushes. Torch-free.

The hot path calls :meth:`Aggregator.call` on every attention call and the
``observe_*`` methods on sampled calls; the publisher thread calls
:meth:`Aggregator.take` to swap the deltas out. One lock, held for a few
dictionary updates, keeps a flush from tearing a call's update in half.

K(C) (``kcops_kc_tokens``) is kept by layer and leaves with a frame only when the
publisher asks (every ``kc_layers_interval_ms``): one histogram per layer would make
every frame several times larger. Its layers stay listed once seen (with zeros),
so that the frames of a probe keep one shape, which the agent then reads in one step.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass

from kcops.kernels import wire

# Histograms of every frame; kcops_kc_tokens goes by layer (``kc_by_layer``), and the
# request histograms only in frames of a flush interval that finished a request.
PER_FRAME = tuple(
    n for n in wire.PLAIN_HISTOGRAMS if n != wire.KC_TOKENS and n not in wire.REQUEST_HISTOGRAMS
)


@dataclass
class Deltas:
    """What the probe saw between two takes: the numbers of one frame (the publisher adds
    who sends it, :class:`~kcops.kernels.wire.Frame`)."""

    calls_by_layer: dict[str, int]
    errors: dict[str, int]
    histograms: dict[str, wire.Histogram]
    topn_mass: dict[int, wire.Histogram]
    kc_by_layer: dict[str, wire.Histogram]
    internal_errors: int
    # The request histograms of requests finished since the last take, by tenant ('': none
    # said); each tenant's go in a frame of their own (wire.Frame.tenant).
    requests: dict[str, dict[str, wire.Histogram]]


class Aggregator:
    """Counters and fixed-bucket histograms since the last :meth:`take`."""

    def __init__(self, topn: tuple[int, ...]) -> None:
        self._lock = threading.Lock()
        self._topn = topn
        self.kc: dict[str, wire.Histogram] = {}  # by layer, since the last take with K(C)
        self._reset()

    def after_fork_in_child(self) -> None:
        """The parent's lock may have been held by its publisher thread at fork time."""
        self._lock = threading.Lock()

    def _reset(self) -> None:
        self.calls: dict[str, int] = {}
        self.errors: dict[str, int] = dict.fromkeys(wire.ERROR_KINDS, 0)
        self.internal_errors = 0
        self.hist: dict[str, wire.Histogram] = {name: wire.Histogram.of(name) for name in PER_FRAME}
        self.requests: dict[str, dict[str, wire.Histogram]] = {}  # by tenant
        self.topn: dict[int, wire.Histogram] = {
            n: wire.Histogram.of(wire.TOPN_MASS) for n in self._topn
        }

    def call(self, layer: str, context_tokens: int | None) -> None:
        """One attention call of ``layer`` over ``context_tokens`` keys (None: unknown)."""
        with self._lock:
            self.calls[layer] = self.calls.get(layer, 0) + 1
            if context_tokens is not None:
                h = self.hist[wire.CONTEXT_TOKENS]
                h.counts[bisect_left(h.bounds, context_tokens)] += 1
                h.sum += context_tokens

    def call_many(self, calls: list[tuple[str, int | None]]) -> None:
        """:meth:`call` for each ``(layer, context_tokens)``, under one lock."""
        with self._lock:
            counts = self.calls
            h = self.hist[wire.CONTEXT_TOKENS]
            bounds, buckets = h.bounds, h.counts
            for layer, tokens in calls:
                counts[layer] = counts.get(layer, 0) + 1
                if tokens is not None:
                    buckets[bisect_left(bounds, tokens)] += 1
                    h.sum += tokens

    def error(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.errors[kind] += n

    def internal_error(self) -> None:
        """The probe's own measuring failed (never the kernel's: that is ``error``)."""
        with self._lock:
            self.internal_errors += 1

    def observe_seconds(self, seconds: float) -> None:
        with self._lock:
            self.hist[wire.ATTENTION_SECONDS].observe(seconds)

    def observe_kc(
        self, layer: str, k_tokens: int, ratio: float, topn_mass: dict[int, float]
    ) -> None:
        """One sampled query row of ``layer``: K_p (first p value), κ and its top-N masses."""
        with self._lock:
            h = self.kc.get(layer)
            if h is None:
                h = self.kc[layer] = wire.Histogram.of(wire.KC_TOKENS)
            h.observe(k_tokens)
            self.hist[wire.KC_RATIO].observe(ratio)
            for n, mass in topn_mass.items():
                t = self.topn.get(n)
                if t is not None:
                    t.observe(mass)

    def observe_request(
        self, context_tokens: int, effective: float | None, tenant: str = ""
    ) -> None:
        """One finished request of ``tenant`` (a bounded label; '' when not known): its
        full context and, when the probe sampled any of its rows, its effective context
        (mean K_p, at most the full context); priced at the effective context if sampled,
        else at the full (docs/kc.md)."""
        with self._lock:
            hists = self.requests.get(tenant)
            if hists is None:
                hists = self.requests[tenant] = {
                    n: wire.Histogram.of(n) for n in wire.REQUEST_HISTOGRAMS
                }
            hists[wire.REQUEST_CONTEXT].observe(context_tokens)
            priced = float(context_tokens)
            if effective is not None:
                priced = min(priced, effective)
                hists[wire.REQUEST_EFFECTIVE].observe(priced)
            hists[wire.REQUEST_PRICED].observe(priced)

    def take(self, *, kc: bool = True) -> Deltas:
        """The deltas since the previous take; the aggregate starts again empty.

        K(C) by layer comes along only with ``kc`` (else it keeps summing until a take that
        asks): every layer seen so far, zeros included."""
        with self._lock:
            calls, errors, hist, topn = self.calls, self.errors, self.hist, self.topn
            requests = self.requests
            internal = self.internal_errors
            self._reset()
            by_layer = {}
            if kc:
                by_layer, self.kc = self.kc, {n: wire.Histogram.of(wire.KC_TOKENS) for n in self.kc}
        return Deltas(calls, errors, hist, topn, by_layer, internal, requests)
