"""The fleet lease in Kubernetes: a ``coordination.k8s.io`` Lease for the lock, the
HPA's own annotations for the state (see :mod:`.lease_core`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from kcops.agent.actions.lease_core import FleetState, FleetWrite, Grant, busy, opt_float
from kcops.agent.outcome import ActionRejected, Refusal

ANN = "kcops.io/"  # annotation prefix of the fleet state on the HPA


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
            raise busy(self.name, spec.holder_identity)
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
            hold_until=opt_float(ann.get(ANN + "hold-until")),
            done_at=opt_float(ann.get(ANN + "scaled-at")),
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
