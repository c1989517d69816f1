"""The one histogram type of kcops, the probe's histograms and their fixed buckets.

Shared by the probe (:mod:`kcops.kernels`) and the agent, so it lives in ``kcops/``
beside the other modules both sides use. Stdlib only: the sidecar has no torch.
:mod:`kcops.kernels.wire` carries these histograms in frames: their buckets are part
of the frame format, so changing one needs a new ``wire.VERSION``.
"""

from __future__ import annotations

import math
import operator
from bisect import bisect_left
from dataclasses import dataclass, field

ATTENTION_SECONDS = "kcops_attention_seconds"
KC_TOKENS = "kcops_kc_tokens"
KC_RATIO = "kcops_kc_ratio"
CONTEXT_TOKENS = "kcops_context_tokens"
TOPN_MASS = "kcops_topn_mass_ratio"
# Per finished request (an engine whose probe attributes K(C) to requests: vLLM's plugin):
# its full context, its effective context (mean K_p of its samples, only sampled ones) and
# the tokens it is priced at (effective if sampled, else full; the agent exports the sum).
REQUEST_CONTEXT = "kcops_request_context_tokens"
REQUEST_EFFECTIVE = "kcops_request_effective_context_tokens"
REQUEST_PRICED = "kcops_request_priced_effective_tokens"
# The reference worker's buckets for the same series (worker/metrics.py): 8 .. 128Ki.
_REQUEST_TOKENS = tuple(float(2**i) for i in range(3, 18))

# Fixed bucket upper bounds (Prometheus ``le``) of each histogram; +Inf is
# implicit and always the last count. Changing any of these needs a new wire.VERSION.
BUCKETS: dict[str, tuple[float, ...]] = {
    ATTENTION_SECONDS: (
        1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ),
    KC_TOKENS: (
        1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768, 65536, 131072,
    ),
    KC_RATIO: (
        0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3,
        0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0,
    ),
    CONTEXT_TOKENS: (
        16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
        65536, 131072, 262144,
    ),
    TOPN_MASS: (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99, 1.0),
    REQUEST_CONTEXT: _REQUEST_TOKENS,
    REQUEST_EFFECTIVE: _REQUEST_TOKENS,
    REQUEST_PRICED: _REQUEST_TOKENS,
}  # fmt: skip


def format_le(bound: float) -> str:
    """A bucket bound as Prometheus (Go) writes ``le``: ``0.25``, ``16.0``, ``1e+06``, ``+Inf``.

    The same text as ``prometheus_client.utils.floatToGoString`` (a test compares them),
    here because this module must not import anything outside the stdlib.
    """
    d = float(bound)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:  # Go switches to exponents sooner than Python
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


@dataclass(slots=True)
class Histogram:
    """Non-cumulative bucket counts: ``counts[i]`` for ``bounds[i-1] < v <= bounds[i]``.

    ``counts`` has ``len(bounds) + 1`` entries; the last is the +Inf bucket. The
    count is their total, so ``_count`` always equals the ``+Inf`` bucket. The
    one histogram type of kcops: the probe fills it, frames carry it, the agent's
    probe receiver sums it and its self-metrics observe tick durations with it.
    """

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        elif len(self.counts) != len(self.bounds) + 1:
            raise ValueError(
                f"histogram has {len(self.counts)} bucket counts, expected {len(self.bounds) + 1}"
            )

    @classmethod
    def of(cls, name: str) -> Histogram:
        """An empty histogram with the fixed buckets of ``name`` (a key of :data:`BUCKETS`)."""
        return cls(BUCKETS[name])

    @property
    def count(self) -> int:
        """How many values were observed (the +Inf bucket's cumulative count)."""
        return sum(self.counts)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    def merge(self, other: Histogram) -> None:
        """Add ``other`` (same bounds) into this one."""
        self.counts = list(map(operator.add, self.counts, other.counts))
        self.sum += other.sum

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, cumulative count)`` pairs as Prometheus exposes them, +Inf last."""
        out: list[tuple[float, int]] = []
        acc = 0
        for le, c in zip((*self.bounds, float("inf")), self.counts, strict=True):
            acc += c
            out.append((le, acc))
        return out

    def les(self) -> list[str]:
        """The ``le`` label of each bucket, +Inf last (see :func:`format_le`)."""
        return [format_le(b) for b in (*self.bounds, math.inf)]
