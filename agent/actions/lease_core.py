"""Fleet actions run once per fleet: a lease first, then a fenced write.

A fleet action (``ActionSpec.scope == "fleet"``: scale_out) runs in whichever
agent of the fleet takes the lease; the others are refused (``busy``) or find
the fleet's cooldown running (``cooldown``). Two backends:

- :class:`~.lease_redis.RedisFleet`, outside Kubernetes: a lock key with a fencing token
  (``INCR``), and the fleet's replica floor in a hash beside it. The write is
  one Lua script that checks the lock is still this token's, that no newer
  token wrote, and that the fleet cooldown has passed, so a holder that
  paused past its lease (GC, SIGSTOP, a slow network) cannot act twice.
- :class:`~.lease_kube.KubeFleet`, in a cluster: a ``coordination.k8s.io`` Lease whose
  ``leaseTransitions`` is the fencing token; the state lives in annotations of
  the HPA itself, written with its ``resourceVersion`` as a precondition, so a
  stale holder's patch fails with 409 instead of raising ``minReplicas`` twice.
  A new token is always above both the Lease's count and the last token the
  HPA recorded (``kcops.io/fence``): a Lease deleted and re-created (or reset
  by a re-apply) restarts above it instead of being refused forever.

All keys of one fleet share a hash tag, so on a Redis Cluster they live in one
slot and each script runs on the one master that owns it (the client is a
``RedisCluster`` when the node says ``cluster_enabled``).

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
