"""``scale_out``: ask for more replicas, once per fleet.

A fleet action: with ``actions.scale.lease.backend`` set it first takes the
fleet lease (:mod:`kcops.agent.actions.lease`), checks the fleet's cooldown,
and writes the new replica floor fenced by its lease token. In a cluster the
floor is the HPA's ``minReplicas`` (``actions.scale.hpa``): the HPA keeps
owning ``replicas``, kcops only stops it from going below the floor until
``hold_s`` has passed, after which any agent's next scale_out (or the hold
task of the agent that raised it) puts the floor back. Outside Kubernetes
the floor lives in Redis and every agent publishes it as
``kcops_desired_replicas``.

With no lease backend the agent acts alone and only publishes the gauge.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import Field

from kcops.agent.actions.base import ActionContext, ActionResult, ActionSpec, Params
from kcops.agent.actions.lease import Fleet, FleetState, FleetWrite, Grant
from kcops.agent.config import Config
from kcops.errors import ActionRejected

# A test seam: awaited between taking the lease and writing (None in production).
PauseHook = Callable[[Grant], Awaitable[None]]


class Replicas:
    """The desired replica count the agent publishes; persisted with the guard state."""

    def __init__(self, desired: int | None = None) -> None:
        self.desired = desired
        # the hold timers this agent started (restore minReplicas after hold_s)
        self.tasks: set[asyncio.Task[None]] = set()


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


def open_fleet(config: Config) -> Fleet | None:
    """The configured fleet backend, or None (this agent acts alone)."""
    cfg = config.actions.scale
    lease = cfg.lease
    if lease.backend == "redis":
        url = lease.redis_url or config.actions.evict.redis_url
        if not url:
            raise ActionRejected(
                "actions.scale.lease.backend is redis but neither lease.redis_url nor "
                "actions.evict.redis_url is set",
                "unsupported",
            )
        from kcops.agent.actions.lease import RedisFleet

        return RedisFleet(url, lease.name, lease.duration_s, cfg.min_replicas)
    if lease.backend == "kubernetes":
        if not cfg.hpa:
            raise ActionRejected(
                "actions.scale.lease.backend is kubernetes but actions.scale.hpa is not set",
                "unsupported",
            )
        from kcops.agent.actions.kube import KubeClient
        from kcops.agent.actions.lease import KubeFleet

        kube = KubeClient(config.actions.kubernetes)
        return KubeFleet(kube, lease.name, cfg.hpa, lease.duration_s)
    return None


def cooldown_of(config: Config) -> float:
    """The fleet's cooldown: lease.cooldown_s, else the scale_out guard cooldown."""
    if config.actions.scale.lease.cooldown_s is not None:
        return config.actions.scale.lease.cooldown_s
    g = config.actions.guards
    return float(g.cooldown_overrides_s.get("scale_out", g.cooldown_s))


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
    pause = ctx.fleet_pause

    async def body(grant: Grant, st: FleetState) -> tuple[FleetState, int]:
        if st.done_at is not None and ctx.now - st.done_at < cooldown:
            raise ActionRejected(
                f"fleet cooldown: {st.done_by} scaled {ctx.now - st.done_at:.0f}s ago "
                f"(cooldown {cooldown:.0f}s)",
                "cooldown",
            )
        current = max(st.replicas, st.min_replicas)
        wanted = min(cfg.max_replicas, max(cfg.min_replicas, current + step))
        if wanted <= st.min_replicas:
            raise ActionRejected(
                f"replica floor {st.min_replicas} already at max_replicas {cfg.max_replicas}",
                "at_bound",
            )
        if pause is not None:
            await pause(grant)
        base = st.base_min if st.base_min is not None else st.min_replicas
        write = FleetWrite(wanted, base, ctx.now + cfg.hold_s, ctx.now)
        await fleet.write(grant, write, cooldown, ctx.now)
        return st, wanted

    try:
        (before, wanted) = await _locked(fleet, holder, ctx.now, body)
    finally:
        await fleet.close()
    replicas.desired = wanted
    _start_hold(ctx.config, replicas, cfg.hold_s)
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
    if cfg.hpa:
        raise ActionRejected(
            f"actions.scale.hpa {cfg.hpa} is set but actions.scale.lease.backend is none: "
            "raising an HPA's floor is a fleet action and needs the lease",
            "unsupported",
        )
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
                f"replicas {current} already at max_replicas {cfg.max_replicas}", "at_bound"
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

    Returns the restored floor, or None when there was nothing to restore.
    Takes the fleet lease, so two agents never restore (or restore and raise) at once.
    """
    fleet = open_fleet(config)
    if fleet is None:
        return None

    async def body(grant: Grant, st: FleetState) -> int | None:
        if st.base_min is None or st.hold_until is None or now < st.hold_until:
            return None
        await fleet.write(grant, FleetWrite(st.base_min, None, None, None), 0.0, now)
        return st.base_min

    try:
        result: int | None = await _locked(fleet, holder_name(config), now, body)
        return result
    finally:
        await fleet.close()


def _start_hold(config: Config, replicas: Replicas, hold_s: float) -> None:
    """After hold_s, give the floor back. Best effort: an agent restarted during the
    hold forgets its timer, and the floor then stays raised until the hold of the
    fleet's next scale_out ends (docs/deploy.md says so)."""

    async def later() -> None:
        import time

        await asyncio.sleep(hold_s)
        try:
            await release_hold(config, time.time())
        except ActionRejected:
            pass  # another agent holds the lease: it will see the expired hold

    task = asyncio.get_running_loop().create_task(later())
    replicas.tasks.add(task)
    task.add_done_callback(replicas.tasks.discard)


SPEC = ActionSpec(
    "scale_out",
    scale_out,
    ScaleParams,
    "Raise the fleet's replica floor (HPA minReplicas, or the desired-replicas gauge) "
    "under the fleet lease, for actions.scale.hold_s.",
    scope="fleet",
)
