"""NaN/Inf checks on attention outputs: every call checked, one reduction per group of calls.

A decode step's attention outputs are small (a few hundred to a few thousand
elements), so what a per-call check costs is the dispatch of its reduction and
the host read, not the arithmetic: on SmolLM2's CPU decode step that was half
of the probe's 3.3%. So a small output is only remembered (a list append);
once ``GROUP_CALLS`` are pending — about one decode step of a 30-layer model —
one ``torch._foreach_norm(ord=inf)`` takes the max-abs of each (NaN stays NaN,
±Inf gives Inf, a finite tensor cannot overflow) and one max decides the
group. Only a non-finite group pays for the exact per-call, per-kind check, so
the counts stay per bad call, as before. A large output (a prefill) is checked
on its own at once: there the reduction's cost is small against the call, and
holding it would pin memory.

On a GPU nothing on the hot path syncs: a group (or a large output) adds its
count of NaN / Inf calls to a per-device flag tensor, and the publisher thread
reads the flags at flush. A call whose output holds both NaN and Inf counts as
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


class ErrorCheck:
    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self._lock = threading.Lock()
        self._pending: list[torch.Tensor] = []
        # device -> int64 [2] running counts (nan, inf) of bad calls, and what was already read
        self._flags: dict[torch.device, torch.Tensor] = {}
        self._read: dict[torch.device, tuple[int, int]] = {}

    def check(self, out: torch.Tensor) -> None:
        """Count ``out`` once as ``nan`` if it holds a NaN and once as ``inf`` if it holds an
        Inf — now for a large output, with its group (or at the next :meth:`drain`) for a
        small one. Integer and empty outputs are not checked."""
        if not out.is_floating_point() or out.numel() == 0:
            return
        if out.numel() > SMALL_NUMEL or (out.is_cuda and torch.cuda.is_current_stream_capturing()):
            # large: cheap against the call, and not worth pinning; under CUDA graph
            # capture: the check must be captured with the call to run on each replay
            self._check_group([out])
            return
        with self._lock:
            self._pending.append(out)
            if len(self._pending) < GROUP_CALLS:
                return
            group, self._pending = self._pending, []
        self._check_group(group)

    def _check_group(self, group: list[torch.Tensor]) -> None:
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for t in group:
            by_device.setdefault(t.device, []).append(t)
        for device, tensors in by_device.items():
            peaks = torch.stack(torch._foreach_norm(tensors, math.inf, dtype=torch.float32))
            if device.type == "cpu":
                if not math.isfinite(float(peaks.max())):
                    self._count_exact(tensors)
            else:
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
        if group:
            self._check_group(group)
        for device, flags in list(self._flags.items()):
            nan, inf = (int(x) for x in flags.to("cpu").tolist())
            prev_nan, prev_inf = self._read.get(device, (0, 0))
            self._read[device] = (nan, inf)
            if nan > prev_nan:
                self.aggregator.error("nan", nan - prev_nan)
            if inf > prev_inf:
                self.aggregator.error("inf", inf - prev_inf)
