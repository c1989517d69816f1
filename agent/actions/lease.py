"""Fleet actions run once per fleet: a lease first, then a fenced write.

A fleet action (``ActionSpec.scope == "fleet"``: scale_out) runs in whichever
agent of the fleet takes the lease; the others are refused (``busy``) or find
the fleet's cooldown running (``cooldown``). Two backends:

- :class:`RedisFleet`, outside Kubernetes: a lock key with a fencing token
  (``INCR``), and the fleet's replica floor in a hash beside it. The write is
  one Lua script that checks the lock is still this token's, that no newer
  token wrote, and that the fleet cooldown has passed, so a holder that
  paused past its lease (GC, SIGSTOP, a slow network) cannot act twice.
- :class:`KubeFleet`, in a cluster: a ``coordination.k8s.io`` Lease whose
  ``leaseTransitions`` is the fencing token; the state lives in annotations of
  the HPA itself, written with its ``resourceVersion`` as a precondition, so a
  stale holder's patch fails with 409 instead of raising ``minReplicas`` twice.
  A new token is always above both the Lease's count and the last token the
  HPA recorded (``kcops.io/fence``): a Lease deleted and re-created (or reset
  by a re-apply) restarts above it instead of being refused forever.

All keys of one fleet share a hash tag, so on a Redis Cluster they live in one
slot and each script runs on the one master that owns it (the client is a
``RedisCluster`` when the node says ``cluster_enabled``).
"""

from __future__ import annotations

from kcops.agent.actions.lease_core import Fleet, FleetState, FleetWrite, Grant, busy
from kcops.agent.actions.lease_kube import ANN, KubeFleet, micro_time
from kcops.agent.actions.lease_redis import RedisFleet, open_redis

__all__ = [
    "ANN",
    "Fleet",
    "FleetState",
    "FleetWrite",
    "Grant",
    "KubeFleet",
    "RedisFleet",
    "busy",
    "micro_time",
    "open_redis",
]
