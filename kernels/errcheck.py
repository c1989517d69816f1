"""NaN/Inf checks on attention outputs: every call checked, one reduction per group of calls.

A decode step's attention outputs are small (a few hundred to a few thousand
elements), so what a per-call check costs is the dispatch of its reduction and
the host read, not the arithmetic. So a small output is only remembered (a list
append); once ``GROUP_CALLS`` are pending — about one decode step of a 30-layer
model — one reduction decides the group. Only a non-finite group pays for the
exact per-call, per-kind check, so the counts stay per bad call.

On the CPU the reduction is the float32 sum of the whole group, concatenated
(:func:`_all_finite`: about 10 µs for 32 SmolLM2 decode outputs, against 230 µs
for the per-tensor ``torch._foreach_norm`` it replaced, whose CPU kernel runs
tensor by tensor). Any NaN or Inf makes that sum non-finite; finite values can
do so only by overflowing float32, and then the exact check clears the group.
A large output (a prefill) is checked on its own at once: there the reduction's
cost is small against the call, and holding it would pin memory.

On a GPU nothing on the hot path syncs: one ``torch._foreach_norm(ord=inf)``
(one fused kernel there) takes each output's max-abs, a group (or a large
output) adds its count of NaN / Inf calls to a per-device flag tensor, and the
publisher thread reads the flags at flush. A call whose output holds both NaN and Inf counts as
``nan`` there (the max-abs is NaN).

Pending outputs are checked at the latest by :meth:`ErrorCheck.drain`, which
the probe runs before every flush, so a bad call reaches the agent in the same
frame as it would have with a check per call, give or take one flush.
"""

from __future__ import annotations

import math
import threading

import torch

from kcops.kernels.aggregate import Aggregator

GROUP_CALLS = 32  # outputs checked together; SmolLM2 has 30 layers
SMALL_NUMEL = 1 << 16  # larger outputs are checked on their own, not held


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """False if any element of ``tensors`` is NaN or ±Inf (and, rarely, when it is not: see
    below), from one reduction: the float32 sum of all their elements.

    Every NaN or Inf makes the sum non-finite: NaN + x is NaN; Inf + a finite x is Inf, and
    Inf + -Inf is NaN. A sum of finite values can be non-finite only by overflowing float32
    (a total beyond ±3.4e38), so a False can be a false alarm, never a True a miss; the
    caller then runs the exact per-tensor test, which also settles the kind. Concatenating
    along dim 0 costs one op when the shapes agree beyond it (the outputs of one decode
    step, whatever the batch); otherwise every tensor is flattened first.
    """
    try:
        flat = torch.cat(tensors)
    except (RuntimeError, IndexError):  # shapes differ beyond dim 0, or 0-dim tensors
        flat = torch.cat([t.reshape(-1) for t in tensors])
    return math.isfinite(flat.sum(dtype=torch.float32).item())


class ErrorCheck:
    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self._lock = threading.Lock()
        self._pending: list[torch.Tensor] = []  # small CPU outputs
        self._pending_dev: list[torch.Tensor] = []  # small outputs on an accelerator
        # device -> int64 [2] running counts (nan, inf) of bad calls, and what was already read
        self._flags: dict[torch.device, torch.Tensor] = {}
        self._read: dict[torch.device, tuple[int, int]] = {}

    def check(self, out: torch.Tensor) -> None:
        """Count ``out`` once as ``nan`` if it holds a NaN and once as ``inf`` if it holds an
        Inf — now for a large output, with its group (or at the next :meth:`drain`) for a
        small one. Integer and empty outputs are not checked."""
        n = out.numel()
        if not n or not out.is_floating_point():
            return
        if out.is_cpu:
            if n > SMALL_NUMEL:  # large: cheap against the call, and not worth pinning
                if not _all_finite([out]):
                    self._count_exact([out])
                return
            with self._lock:
                pending = self._pending
                pending.append(out)
                if len(pending) < GROUP_CALLS:
                    return
                self._pending = []
            self._check_cpu(pending)
            return
        if n > SMALL_NUMEL or (out.is_cuda and torch.cuda.is_current_stream_capturing()):
            # under CUDA graph capture the check must be captured with the call to run on
            # each replay
            self._check_device([out])
            return
        with self._lock:
            pending = self._pending_dev
            pending.append(out)
            if len(pending) < GROUP_CALLS:
                return
            self._pending_dev = []
        self._check_device(pending)

    def check_cpu_group(self, group: list[torch.Tensor]) -> None:
        """Check small, floating, non-empty CPU outputs now, as one group (the probe's
        unsampled calls, gathered by the probe itself)."""
        self._check_cpu(group)

    def _check_cpu(self, group: list[torch.Tensor]) -> None:
        """One reduction for the group; the exact test per tensor only if it flags."""
        if group and not _all_finite(group):
            self._count_exact(group)

    def _check_device(self, group: list[torch.Tensor]) -> None:
        """Per tensor max-abs on each device, added to its flags: no sync."""
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for t in group:
            by_device.setdefault(t.device, []).append(t)
        for device, tensors in by_device.items():
            peaks = torch.stack(torch._foreach_norm(tensors, math.inf, dtype=torch.float32))
            self._flag(device, peaks)

    def _count_exact(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            if bool(torch.isnan(t).any()):
                self.aggregator.error("nan")
            if bool(torch.isinf(t).any()):
                self.aggregator.error("inf")

    def _flag(self, device: torch.device, peaks: torch.Tensor) -> None:
        flags = self._flags.get(device)
        if flags is None:
            with self._lock:
                flags = self._flags.setdefault(
                    device, torch.zeros(2, dtype=torch.int64, device=device)
                )
        flags.add_(torch.stack((torch.isnan(peaks).sum(), torch.isinf(peaks).sum())))

    def drain(self) -> None:
        """Check what is pending and read the device flags (the publisher thread, before a
        flush); new bad calls go into the aggregate."""
        with self._lock:
            group, self._pending = self._pending, []
            group_dev, self._pending_dev = self._pending_dev, []
        self._check_cpu(group)
        if group_dev:
            self._check_device(group_dev)
        for device, flags in list(self._flags.items()):
            nan, inf = (int(x) for x in flags.to("cpu").tolist())
            prev_nan, prev_inf = self._read.get(device, (0, 0))
            self._read[device] = (nan, inf)
            if nan > prev_nan:
                self.aggregator.error("nan", nan - prev_nan)
            if inf > prev_inf:
                self.aggregator.error("inf", inf - prev_inf)
