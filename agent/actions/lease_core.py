"""The fleet lease's types: a grant with its fencing token, the fleet's state and a
write of it, and the :class:`Fleet` protocol both backends (:mod:`.lease_redis`,
:mod:`.lease_kube`) follow. :mod:`.lease` says how they fence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from kcops.agent.actions.outcome import Refusal
from kcops.errors import ActionRejected


@dataclass(frozen=True)
class Grant:
    holder: str
    token: int  # fencing token: strictly increasing per lease
    duration_s: float
    taken_mono: float

    def check(self) -> None:
        """Refuse to act on a lease that has run out on our own clock."""
        if time.monotonic() - self.taken_mono >= self.duration_s:
            raise ActionRejected(
                f"lease token {self.token} of {self.holder} expired before the write",
                Refusal.FENCED,
            )


@dataclass
class FleetState:
    """What the fleet asked for so far. Times are Unix seconds; None: never."""

    min_replicas: int  # the floor now (HPA minReplicas, or the published desired count)
    replicas: int  # what runs now (HPA currentReplicas; = min_replicas without Kubernetes)
    base_min: int | None = None  # the floor before the hold began
    hold_until: float | None = None
    done_at: float | None = None
    done_by: str | None = None
    fence: int = 0
    max_replicas: int | None = None  # the HPA's own maxReplicas; None: no such bound


@dataclass(frozen=True)
class FleetWrite:
    min_replicas: int
    base_min: int | None
    hold_until: float | None
    done_at: float | None


class Fleet(Protocol):
    async def acquire(self, holder: str, now: float) -> Grant: ...
    async def release(self, grant: Grant) -> None: ...
    async def read(self) -> FleetState: ...
    async def write(self, grant: Grant, w: FleetWrite, cooldown_s: float, now: float) -> None: ...
    async def close(self) -> None: ...


def busy(name: str, holder: str) -> ActionRejected:
    return ActionRejected(f"fleet lease {name} is held by {holder}", Refusal.BUSY)


def opt_float(v: str | bytes | float | None) -> float | None:
    """A number stored as text (a Redis hash field, an annotation); None when empty."""
    return None if v in (None, b"", "") else float(v)
