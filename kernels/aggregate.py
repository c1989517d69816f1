"""In-process aggregation of what the probe sees between two flushes. Torch-free.

The hot path calls :meth:`Aggregator.call` on every attention call and the
``observe_*`` methods on sampled calls; the publisher thread calls
:meth:`Aggregator.take` to swap the deltas out. One lock, held for a few
dictionary updates, keeps a flush from tearing a call's update in half.
"""

from __future__ import annotations

import threading
from bisect import bisect_left

from kcops.kernels import wire


class Aggregator:
    """Counters and fixed-bucket histograms since the last :meth:`take`."""

    def __init__(self, topn: tuple[int, ...]) -> None:
        self._lock = threading.Lock()
        self._topn = topn
        self._reset()

    def after_fork_in_child(self) -> None:
        """The parent's lock may have been held by its publisher thread at fork time."""
        self._lock = threading.Lock()

    def _reset(self) -> None:
        self.calls: dict[str, int] = {}
        self.errors: dict[str, int] = dict.fromkeys(wire.ERROR_KINDS, 0)
        self.hist: dict[str, wire.Histogram] = {
            name: wire.Histogram.of(name) for name in wire.PLAIN_HISTOGRAMS
        }
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

    def error(self, kind: str, n: int = 1) -> None:
        with self._lock:
            self.errors[kind] += n

    def observe_seconds(self, seconds: float) -> None:
        with self._lock:
            self.hist[wire.ATTENTION_SECONDS].observe(seconds)

    def observe_kc(self, k_tokens: int, ratio: float, topn_mass: dict[int, float]) -> None:
        """One sampled query row: K_p (first p value), κ and its top-N masses."""
        with self._lock:
            self.hist[wire.KC_TOKENS].observe(k_tokens)
            self.hist[wire.KC_RATIO].observe(ratio)
            for n, mass in topn_mass.items():
                h = self.topn.get(n)
                if h is not None:
                    h.observe(mass)

    def take(self, pid: int, process: str, seq: int, instance: str, ts: float) -> wire.Frame:
        """The deltas since the previous take, as a frame; the aggregate starts again empty."""
        with self._lock:
            calls, errors, hist, topn = self.calls, self.errors, self.hist, self.topn
            self._reset()
        return wire.Frame(
            pid=pid,
            process=process,
            seq=seq,
            instance=instance,
            ts=ts,
            calls_by_layer=calls,
            errors=errors,
            histograms=hist,
            topn_mass=topn,
        )
