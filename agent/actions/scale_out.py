"""``scale_out``: ask for more replicas, once per fleet.

A fleet action: with ``actions.scale.lease.backend`` set it first takes the
fleet lease (:mod:`kcops.agent.actions.lease_core`), checks the fleet's cooldown,
and writes the new replica floor fenced by its lease token: the HPA's
``minReplicas`` in a cluster (never above its ``maxReplicas``; the HPA keeps
owning ``replicas``), else a Redis hash, published as ``kcops_desired_replicas``.
The hold's end is recorded with the floor, and every agent of the fleet checks
it every :data:`RELEASE_CHECK_S` (:class:`HoldKeeper`): the first to see it
passed puts the floor back, even when the agent that raised it is gone.

With no lease backend the agent acts alone and only publishes the gauge.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field

from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Check,
    Params,
    Replicas,
    kube_token,
)
from kcops.agent.actions.lease_core import Fleet, FleetState, FleetWrite, Grant
from kcops.agent.config import Config
from kcops.agent.outcome import ActionName, ActionRejected, Refusal

log = logging.getLogger("kcops.agent.actions")

# A test seam: awaited between taking the lease and writing (None in production).

# How often each agent reads the fleet's hold (one GET of the HPA, or one HGETALL).
RELEASE_CHECK_S = 30.0


class ScaleParams(Params):
    step: int | None = Field(None, ge=1, le=100, description="default: actions.scale.step")


def holder_name(config: Config) -> str:
    lease = config.actions.scale.lease
    return (
        lease.holder
        or config.actions.kubernetes.pod_name
        or os.environ.get("POD_NAME")
        or os.environ.get("HOSTNAME")
        or f"pid-{os.getpid()}"
    )


def configured(config: Config) -> None:
    """Refuse what the configuration alone says scale_out cannot do: checked by its
    precheck (so a dry run says it too) and again by :func:`open_fleet` before acting."""
    cfg = config.actions.scale
    lease = cfg.lease
    if not (cfg.deployment or cfg.hpa or cfg.hpa_reads_gauge) and lease.backend == "none":
        # Nothing would act on its number: it would report a scale-out that never is.
        raise ActionRejected(
            "scale_out: no scaler configured (set actions.scale.deployment, actions.scale.hpa, "
            "actions.scale.hpa_reads_gauge, or a fleet lease)",
            Refusal.NOT_CONFIGURED,
        )
    if cfg.hpa and lease.backend == "none":
        raise ActionRejected(
            f"actions.scale.hpa {cfg.hpa} is set but actions.scale.lease.backend is none: "
            "raising an HPA's floor is a fleet action and needs the lease",
            Refusal.UNSUPPORTED,
        )
    if lease.backend == "kubernetes" and not cfg.hpa:
        raise ActionRejected(
            "actions.scale.lease.backend is kubernetes but actions.scale.hpa is not set",
            Refusal.UNSUPPORTED,
        )
    if lease.backend == "redis" and not (lease.redis_url or config.actions.evict.redis_url):
        raise ActionRejected(
            "actions.scale.lease.backend is redis but neither lease.redis_url nor "
            "actions.evict.redis_url is set",
            Refusal.UNSUPPORTED,
        )


def precheck(check: Check, _: Params) -> None:
    configured(check.config)
    cfg = check.config.actions.scale
    if cfg.lease.backend == "kubernetes" or (cfg.lease.backend == "none" and cfg.deployment):
        kube_token(check, ActionName.SCALE_OUT)  # it would call the Kubernetes API


def open_fleet(config: Config) -> Fleet | None:
    """The configured fleet backend, or None (this agent acts alone); ActionRejected for
    a configuration it cannot act on (:func:`configured`)."""
    configured(config)
    cfg = config.actions.scale
    lease = cfg.lease
    if lease.backend == "redis":
        url = lease.redis_url or config.actions.evict.redis_url
        assert url  # configured() checked it
        from kcops.agent.actions.lease_redis import RedisFleet

        return RedisFleet(url, lease.name, lease.duration_s, cfg.min_replicas)
    if lease.backend == "kubernetes":
        from kcops.agent.actions.kube import KubeClient
        from kcops.agent.actions.lease_kube import KubeFleet

        assert cfg.hpa  # configured() checked it
        return KubeFleet(
            KubeClient(config.actions.kubernetes), lease.name, cfg.hpa, lease.duration_s
        )
    return None


def cooldown_of(config: Config) -> float:
    """The fleet's cooldown: lease.cooldown_s, else the scale_out guard cooldown."""
    if config.actions.scale.lease.cooldown_s is not None:
        return config.actions.scale.lease.cooldown_s
    g = config.actions.guards
    return float(g.cooldown_overrides_s.get(ActionName.SCALE_OUT, g.cooldown_s))


async def _locked(
    fleet: Fleet, holder: str, now: float, body: Callable[[Grant, FleetState], Awaitable[Any]]
) -> Any:
    grant = await fleet.acquire(holder, now)
    try:
        return await body(grant, await fleet.read())
    finally:
        try:
            await fleet.release(grant)
        except Exception:  # an expired or lost lease runs out by itself
            pass


async def scale_out(ctx: ActionContext, p: ScaleParams) -> ActionResult:
    cfg = ctx.config.actions.scale
    replicas = ctx.replicas if ctx.replicas is not None else Replicas()
    step = p.step or cfg.step
    fleet = open_fleet(ctx.config)
    if fleet is None:
        return await _alone(ctx, replicas, step)
    holder = holder_name(ctx.config)
    cooldown = cooldown_of(ctx.config)

    async def body(grant: Grant, st: FleetState) -> tuple[FleetState, int]:
        if st.done_at is not None and ctx.now - st.done_at < cooldown:
            raise ActionRejected(
                f"fleet cooldown: {st.done_by} scaled {ctx.now - st.done_at:.0f}s ago "
                f"(cooldown {cooldown:.0f}s)",
                Refusal.COOLDOWN,
            )
        current = max(st.replicas, st.min_replicas)
        top, bound = cfg.max_replicas, "actions.scale.max_replicas"
        if st.max_replicas is not None and st.max_replicas < top:
            top, bound = st.max_replicas, "the HPA's maxReplicas"
        wanted = min(top, max(cfg.min_replicas, current + step))
        if wanted <= st.min_replicas:
            raise ActionRejected(
                f"replica floor {st.min_replicas} already at {bound} {top}", Refusal.AT_BOUND
            )
        base = st.base_min if st.base_min is not None else st.min_replicas
        write = FleetWrite(wanted, base, ctx.now + cfg.hold_s, ctx.now)
        await fleet.write(grant, write, cooldown, ctx.now)
        return st, wanted

    try:
        (before, wanted) = await _locked(fleet, holder, ctx.now, body)
    finally:
        await fleet.close()
    replicas.desired = wanted
    target = f"HPA {cfg.hpa} minReplicas" if cfg.lease.backend == "kubernetes" else "fleet floor"
    return ActionResult(
        detail=f"{target} {before.min_replicas} -> {wanted} for {cfg.hold_s:.0f}s (as {holder})",
        before={"min_replicas": before.min_replicas, "replicas": before.replicas},
        after={"min_replicas": wanted},
        data={"holder": holder, "hold_s": cfg.hold_s, "backend": cfg.lease.backend},
    )


async def _alone(ctx: ActionContext, replicas: Replicas, step: int) -> ActionResult:
    """No fleet lease: a single replica's agent. With actions.scale.deployment (and no
    HPA owning it) it patches the Deployment's scale; else it only publishes the gauge."""
    cfg = ctx.config.actions.scale
    kube = None
    if cfg.deployment:
        from kcops.agent.actions.kube import KubeClient

        kube = KubeClient(ctx.config.actions.kubernetes)
    try:
        if kube is not None and cfg.deployment:
            current = await kube.get_scale(cfg.deployment)
        else:
            current = replicas.desired if replicas.desired is not None else cfg.min_replicas
        wanted = min(cfg.max_replicas, max(cfg.min_replicas, current + step))
        if wanted <= current:
            raise ActionRejected(
                f"replicas {current} already at max_replicas {cfg.max_replicas}", Refusal.AT_BOUND
            )
        if kube is not None and cfg.deployment:
            await kube.patch_scale(cfg.deployment, wanted)
    finally:
        if kube is not None:
            await kube.close()
    replicas.desired = wanted
    return ActionResult(
        detail=f"desired replicas {current} -> {wanted} (this agent alone, no fleet lease)",
        before={"replicas": current},
        after={"replicas": wanted},
        data={"deployment": cfg.deployment},
    )


async def release_hold(config: Config, now: float) -> int | None:
    """Put the floor back to what it was before the hold, once the hold has passed.

    Returns the restored floor, or None when there was nothing to restore. Reads
    the fleet's state first (no lease needed to find nothing to do); only a hold
    that has passed takes the fleet lease, so two agents never restore (or
    restore and raise) at once. Raises ActionRejected (``busy``: another agent
    holds the lease; ``fenced``) and the backend's errors.
    """
    fleet = open_fleet(config)
    if fleet is None:
        return None

    def passed(st: FleetState) -> bool:
        return st.base_min is not None and st.hold_until is not None and now >= st.hold_until

    async def body(grant: Grant, st: FleetState) -> int | None:
        if not passed(st) or st.base_min is None:
            return None
        await fleet.write(grant, FleetWrite(st.base_min, None, None, None), 0.0, now)
        return st.base_min

    try:
        if not passed(await fleet.read()):
            return None
        result: int | None = await _locked(fleet, holder_name(config), now, body)
        return result
    finally:
        await fleet.close()


class HoldKeeper:
    """Ends the fleet's hold from whichever agent sees it passed first.

    :meth:`poll` is called from the remediation tick; every ``every_s`` it
    starts one background check (never more than one at a time, never on the
    tick itself). Only an enforcing agent with a fleet lease backend checks.
    """

    def __init__(
        self,
        config: Config,
        on_release: Callable[[float, int], None],
        every_s: float = RELEASE_CHECK_S,
    ) -> None:
        self.config = config
        self.on_release = on_release  # (now, the restored floor): publish, save, audit
        self.every_s = every_s
        self.next_at = 0.0
        self.task: asyncio.Task[None] | None = None
        self.last_error: str | None = None

    def poll(self, now: float) -> None:
        cfg = self.config.actions
        if cfg.mode != "enforce" or cfg.scale.lease.backend == "none":
            return
        if now < self.next_at or (self.task is not None and not self.task.done()):
            return
        self.next_at = now + self.every_s
        self.task = asyncio.get_running_loop().create_task(self._check(now))

    async def _check(self, now: float) -> None:
        try:
            restored = await release_hold(self.config, now)
        except ActionRejected as exc:
            # busy: another agent holds the lease and sees the same expired hold
            self.last_error = str(exc)
            log.debug("fleet hold not released here: %s", exc)
            return
        except Exception as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning("fleet hold check failed: %s", self.last_error)
            return
        self.last_error = None
        if restored is not None:
            self.on_release(now, restored)
            log.info("fleet hold over: replica floor back to %d", restored)

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)


SPEC = ActionSpec(
    ActionName.SCALE_OUT,
    scale_out,
    ScaleParams,
    "Raise the fleet's replica floor (HPA minReplicas, or the desired-replicas gauge) "
    "under the fleet lease, for actions.scale.hold_s.",
    precheck=precheck,
    scope="fleet",
    target="replicas",
)
