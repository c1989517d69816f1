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

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kcops.agent.actions.outcome import Refusal
from kcops.errors import ActionRejected

ANN = "kcops.io/"  # annotation prefix of the fleet state on the HPA


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


def _busy(name: str, holder: str) -> ActionRejected:
    return ActionRejected(f"fleet lease {name} is held by {holder}", Refusal.BUSY)


# -- Redis -------------------------------------------------------------------------

_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then return {0, cur} end
local tok = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok, 'PX', ARGV[2])
return {1, tok}
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# KEYS: lock, state. ARGV: holder|token, token, now, cooldown, min, base, hold_until, done_at
_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 'lost' end
local last = tonumber(redis.call('HGET', KEYS[2], 'fence') or '0')
if tonumber(ARGV[2]) <= last then return 'stale' end
local done = redis.call('HGET', KEYS[2], 'done_at')
if ARGV[8] ~= '' and done and tonumber(ARGV[3]) - tonumber(done) < tonumber(ARGV[4]) then
  return 'cooldown'
end
redis.call('HSET', KEYS[2], 'fence', ARGV[2], 'min_replicas', ARGV[5], 'base_min', ARGV[6],
  'hold_until', ARGV[7], 'done_by', ARGV[1])
if ARGV[8] ~= '' then redis.call('HSET', KEYS[2], 'done_at', ARGV[8]) end
return 'ok'
"""


def _opt_float(v: Any) -> float | None:
    return None if v in (None, b"", "") else float(v)


async def open_redis(url: str) -> Any:
    """``redis.asyncio.Redis`` for a single node, ``RedisCluster`` for a cluster node."""
    import redis.asyncio as aioredis
    from redis.asyncio.cluster import RedisCluster

    node = aioredis.Redis.from_url(url, socket_timeout=5.0)
    try:
        info = await node.info("cluster")
    except Exception:
        await node.aclose()
        raise
    if not int(info.get("cluster_enabled", 0)):
        return node
    await node.aclose()
    cluster = RedisCluster.from_url(url, socket_timeout=5.0)
    await cluster.initialize()
    return cluster


class RedisFleet:
    """The fleet lease and state in Redis (one node or a cluster)."""

    def __init__(self, url: str, name: str, duration_s: float, floor: int) -> None:
        self.url = url
        self.name = name
        self.duration_s = duration_s
        self.floor = floor
        tag = "{kcops:fleet:" + name + "}"
        self.k_lock, self.k_fence, self.k_state = tag + ":lock", tag + ":fence", tag + ":state"
        self._client: Any = None

    async def client(self) -> Any:
        """A plain client for one node; a ``RedisCluster`` when the node is in cluster
        mode (a plain client would get MOVED for every slot another master owns)."""
        if self._client is None:
            self._client = await open_redis(self.url)
        return self._client

    async def acquire(self, holder: str, now: float) -> Grant:
        ms = str(int(self.duration_s * 1000))
        ok, val = await (await self.client()).eval(
            _ACQUIRE, 2, self.k_lock, self.k_fence, holder, ms
        )
        if not ok:
            raise _busy(self.name, val.decode() if isinstance(val, bytes) else str(val))
        return Grant(holder, int(val), self.duration_s, time.monotonic())

    async def release(self, grant: Grant) -> None:
        await (await self.client()).eval(_RELEASE, 1, self.k_lock, f"{grant.holder}|{grant.token}")

    async def read(self) -> FleetState:
        h = await (await self.client()).hgetall(self.k_state)
        floor = int(h.get(b"min_replicas", self.floor))
        by = h.get(b"done_by")
        return FleetState(
            min_replicas=floor,
            replicas=floor,
            base_min=None if h.get(b"base_min", b"") == b"" else int(h[b"base_min"]),
            hold_until=_opt_float(h.get(b"hold_until")),
            done_at=_opt_float(h.get(b"done_at")),
            done_by=by.decode() if by else None,
            fence=int(h.get(b"fence", 0)),
        )

    async def write(self, grant: Grant, w: FleetWrite, cooldown_s: float, now: float) -> None:
        grant.check()

        def s(v: float | int | None) -> str:
            return "" if v is None else repr(v)

        res = await (await self.client()).eval(
            _WRITE,
            2,
            self.k_lock,
            self.k_state,
            f"{grant.holder}|{grant.token}",
            str(grant.token),
            repr(now),
            repr(cooldown_s),
            str(w.min_replicas),
            s(w.base_min),
            s(w.hold_until),
            s(w.done_at),
        )
        res = res.decode() if isinstance(res, bytes) else str(res)
        if res == "cooldown":  # the script's answer
            raise ActionRejected(f"fleet {self.name} scaled within the cooldown", Refusal.COOLDOWN)
        if res != "ok":
            raise ActionRejected(
                f"fleet {self.name}: write with token {grant.token} refused ({res}): "
                "the lease passed to another agent",
                Refusal.FENCED,
            )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


# -- Kubernetes -----------------------------------------------------------------------


def _ts(dt: datetime | None) -> float | None:
    return None if dt is None else dt.timestamp()


def micro_time(t: float | datetime) -> str:
    """A MicroTime as the API server parses it (RFC 3339 with exactly six fraction
    digits). ``datetime.isoformat()``, which the client would use, drops the
    fraction when it is zero, and the server refuses that."""
    dt = t if isinstance(t, datetime) else datetime.fromtimestamp(t, UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubeFleet:
    """A Lease for the lock; the HPA's own annotations for the state."""

    def __init__(self, kube: Any, name: str, hpa: str, duration_s: float) -> None:
        self.kube = kube
        self.name = name
        self.hpa = hpa
        self.duration_s = duration_s
        self._rv: str | None = None

    async def acquire(self, holder: str, now: float) -> Grant:
        from kubernetes_asyncio import client

        from kcops.agent.actions.kube import KubeError

        ns = self.kube.namespace()
        coord = self.kube.apis().coordination
        # The token must pass the HPA's last recorded one, whatever the Lease says.
        recorded = (await self.read()).fence
        stamp = micro_time(now)
        dur = max(1, round(self.duration_s))
        try:
            lease = await self.kube.call(
                f"get lease {ns}/{self.name}", coord.read_namespaced_lease, self.name, ns
            )
        except KubeError as exc:
            if exc.status != 404:
                raise
            return await self._create(ns, holder, recorded + 1, stamp, dur)
        if lease.spec is None:
            lease.spec = client.V1LeaseSpec()
        spec = lease.spec
        renew = _ts(spec.renew_time) if isinstance(spec.renew_time, datetime) else None
        if spec.holder_identity and (renew or 0.0) + (spec.lease_duration_seconds or 0) > now:
            raise _busy(self.name, spec.holder_identity)
        token = max(int(spec.lease_transitions or 0), recorded) + 1
        spec.holder_identity = holder
        spec.lease_duration_seconds = dur
        spec.acquire_time = stamp
        spec.renew_time = stamp
        spec.lease_transitions = token
        # replace carries metadata.resourceVersion: a concurrent taker gets 409.
        await self._write(
            f"update lease {ns}/{self.name}",
            coord.replace_namespaced_lease,
            self.name,
            ns,
            lease,
        )
        return Grant(holder, token, self.duration_s, time.monotonic())

    async def _create(self, ns: str, holder: str, token: int, stamp: str, dur: int) -> Grant:
        """No Lease: create it (deploy/ ships it, and its Role has no ``create``)."""
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": self.name},
            "spec": {
                "holderIdentity": holder,
                "leaseDurationSeconds": dur,
                "acquireTime": stamp,
                "renewTime": stamp,
                "leaseTransitions": token,
            },
        }
        coord = self.kube.apis().coordination
        try:
            await self._write(
                f"create lease {ns}/{self.name}", coord.create_namespaced_lease, ns, body
            )
        except ActionRejected as exc:
            if exc.reason != Refusal.FORBIDDEN:
                raise
            raise ActionRejected(
                f"fleet lease {ns}/{self.name} does not exist and this agent may not create "
                f"it: apply deploy/ (base/lease.yaml) again ({exc})",
                Refusal.FORBIDDEN,
            ) from None
        return Grant(holder, token, self.duration_s, time.monotonic())

    async def _write(self, what: str, fn: Any, *args: Any, conflict: Refusal = Refusal.BUSY) -> Any:
        from kcops.agent.actions.kube import KubeError

        try:
            return await self.kube.call(what, fn, *args)
        except KubeError as exc:
            if exc.status == 409:
                raise ActionRejected(f"{what}: another agent got there first", conflict) from None
            raise

    async def release(self, grant: Grant) -> None:
        """Give the lease up (holder cleared) if it is still ours; a lost one is left alone."""
        ns = self.kube.namespace()
        coord = self.kube.apis().coordination
        lease = await self.kube.call(
            f"get lease {ns}/{self.name}", coord.read_namespaced_lease, self.name, ns
        )
        if (
            lease.spec is None
            or lease.spec.holder_identity != grant.holder
            or (int(lease.spec.lease_transitions or 0) != grant.token)
        ):
            return
        lease.spec.holder_identity = None
        # Sent back as read: the client would write these MicroTimes in a form the
        # server refuses when their fraction is zero.
        for attr in ("acquire_time", "renew_time"):
            value = getattr(lease.spec, attr)
            if isinstance(value, datetime):
                setattr(lease.spec, attr, micro_time(value))
        await self._write(
            f"update lease {ns}/{self.name}", coord.replace_namespaced_lease, self.name, ns, lease
        )

    async def read(self) -> FleetState:
        ns = self.kube.namespace()
        hpa = await self.kube.call(
            f"get horizontalpodautoscaler {ns}/{self.hpa}",
            self.kube.apis().autoscaling.read_namespaced_horizontal_pod_autoscaler,
            self.hpa,
            ns,
        )
        self._rv = hpa.metadata.resource_version
        ann = hpa.metadata.annotations or {}
        floor = int(hpa.spec.min_replicas or 1)
        running = int(getattr(hpa.status, "current_replicas", None) or floor)
        top = hpa.spec.max_replicas
        base = ann.get(ANN + "base-min-replicas")
        return FleetState(
            min_replicas=floor,
            replicas=running,
            base_min=int(base) if base else None,
            hold_until=_opt_float(ann.get(ANN + "hold-until")),
            done_at=_opt_float(ann.get(ANN + "scaled-at")),
            done_by=ann.get(ANN + "scaled-by"),
            fence=int(ann.get(ANN + "fence", 0)),
            max_replicas=int(top) if top else None,
        )

    async def write(self, grant: Grant, w: FleetWrite, cooldown_s: float, now: float) -> None:
        """Patch minReplicas and the state annotations, fenced twice: the token must be
        newer than the last writer's, and resourceVersion must be the one read."""
        state = await self.read()
        if grant.token <= state.fence:
            raise ActionRejected(
                f"HPA {self.hpa} was written by token {state.fence} >= ours {grant.token}",
                Refusal.FENCED,
            )
        if w.done_at is not None and state.done_at is not None and now - state.done_at < cooldown_s:
            raise ActionRejected(f"fleet {self.hpa} scaled within the cooldown", Refusal.COOLDOWN)
        grant.check()
        ann: dict[str, str | None] = {
            ANN + "fence": str(grant.token),
            ANN + "base-min-replicas": None if w.base_min is None else str(w.base_min),
            ANN + "hold-until": None if w.hold_until is None else repr(w.hold_until),
            ANN + "scaled-by": grant.holder,
        }
        if w.done_at is not None:
            ann[ANN + "scaled-at"] = repr(w.done_at)
        body = {
            "metadata": {"resourceVersion": self._rv, "annotations": ann},
            "spec": {"minReplicas": w.min_replicas},
        }
        ns = self.kube.namespace()
        await self._write(
            f"patch horizontalpodautoscaler {ns}/{self.hpa}",
            self.kube.apis().autoscaling.patch_namespaced_horizontal_pod_autoscaler,
            self.hpa,
            ns,
            body,
            conflict=Refusal.FENCED,
        )

    async def close(self) -> None:
        await self.kube.close()
