"""NaN/Inf checks on attention outputs without a device sync per call.

On the CPU the check is immediate. On a GPU each check adds "does this output
hold a NaN / an Inf" to a per-device flag tensor (kernels only, no sync); the
publisher thread reads the flags at flush and counts the calls that went bad.
"""

from __future__ import annotations

import math
import threading

import torch

from kcops.kernels.aggregate import Aggregator


class ErrorCheck:
    def __init__(self, aggregator: Aggregator) -> None:
        self.aggregator = aggregator
        self._lock = threading.Lock()
        # device -> int64 [2] running counts (nan, inf) of bad calls, and what was already read
        self._flags: dict[torch.device, torch.Tensor] = {}
        self._read: dict[torch.device, tuple[int, int]] = {}

    def check(self, out: torch.Tensor) -> None:
        """Count ``out`` once as ``nan`` if it holds a NaN and once as ``inf`` if it holds an Inf.

        One float32 sum is the fast path: it is finite iff every element is (in float32
        it cannot overflow for attention outputs). Only a non-finite sum pays for the
        exact per-kind check. On a GPU the kind is read from the sum itself (a call with
        both +Inf and -Inf counts as ``nan``), to stay at two small kernels per call.
        """
        if not out.is_floating_point():
            return
        if out.device.type == "cpu":
            if math.isfinite(out.sum(dtype=torch.float32).item()):
                return
            if bool(torch.isnan(out).any()):
                self.aggregator.error("nan")
            if bool(torch.isinf(out).any()):
                self.aggregator.error("inf")
            return
        flags = self._flags.get(out.device)
        if flags is None:
            with self._lock:
                flags = self._flags.setdefault(
                    out.device, torch.zeros(2, dtype=torch.int64, device=out.device)
                )
        total = out.sum(dtype=torch.float32)
        flags.add_(torch.stack((torch.isnan(total), torch.isinf(total))))

    def drain(self) -> None:
        """Read the device flags (publisher thread) and add the new bad calls to the aggregate."""
        for device, flags in list(self._flags.items()):
            nan, inf = (int(x) for x in flags.to("cpu").tolist())
            prev_nan, prev_inf = self._read.get(device, (0, 0))
            self._read[device] = (nan, inf)
            if nan > prev_nan:
                self.aggregator.error("nan", nan - prev_nan)
            if inf > prev_inf:
                self.aggregator.error("inf", inf - prev_inf)
