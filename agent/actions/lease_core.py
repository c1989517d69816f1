"""Fleet actions run once per fleet: a lease first, then a fenced write.

A fleet action (``ActionSpec.scope == "fleet"``: scale_out) runs in whichever
agent of the fleet takes the lease; the others are refused (``busy``) or find
the fleet's cooldown running (``cooldown``). The fencing token makes a holder
that paused past its lease (GC, SIGSTOP, a slow network) unable to act twice:

- :class:`~.lease_redis.RedisFleet`, outside Kubernetes: a lock key with an
  ``INCR`` token; the write is one Lua script that checks the lock, the token
  and the fleet cooldown. All keys of one fleet share a hash tag, so on a Redis
  Cluster each script runs on the one master that owns their slot.
- :class:`~.lease_kube.KubeFleet`, in a cluster: a ``coordination.k8s.io`` Lease
  whose ``leaseTransitions`` is the token; the state lives in the HPA's
  annotations, patched with its ``resourceVersion`` as a precondition (a stale
  holder gets 409).

Here: a grant with its fencing token, the fleet's state and a write of it, and the
:class:`Fleet` protocol both backends follow.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from kcops.agent.outcome import ActionRejected, Refusal


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
