"""``scale_out``: ask for more replicas.

Always publishes ``kcops_desired_replicas`` (an HPA reads it through
prometheus-adapter); when ``actions.scale.deployment`` is set it also patches
that Deployment's scale subresource through the Kubernetes API.
"""

from __future__ import annotations

from pydantic import Field

from kcops.agent.actions.base import ActionContext, ActionResult, ActionSpec, Params
from kcops.agent.actions.kube import KubeClient
from kcops.agent.errors import ActionRejected


class Replicas:
    """The desired replica count the agent publishes; persisted with the guard state."""

    def __init__(self, desired: int | None = None) -> None:
        self.desired = desired


class ScaleParams(Params):
    step: int | None = Field(None, ge=1, description="default: actions.scale.step")


async def scale_out(ctx: ActionContext, p: ScaleParams) -> ActionResult:
    cfg = ctx.config.actions.scale
    replicas: Replicas = ctx.services["replicas"]
    kube = KubeClient(ctx.config.actions.kubernetes) if cfg.deployment else None
    if kube is not None and cfg.deployment:
        current = await kube.get_scale(cfg.deployment)
    else:
        current = replicas.desired if replicas.desired is not None else cfg.min_replicas
    wanted = min(cfg.max_replicas, max(cfg.min_replicas, current + (p.step or cfg.step)))
    if wanted <= current:
        raise ActionRejected(
            f"replicas {current} already at max_replicas {cfg.max_replicas}", "at_bound"
        )
    if kube is not None and cfg.deployment:
        await kube.patch_scale(cfg.deployment, wanted)
    replicas.desired = wanted
    return ActionResult(
        detail=f"desired replicas {current} -> {wanted}",
        before={"replicas": current},
        after={"replicas": wanted},
        data={"deployment": cfg.deployment},
    )


SPEC = ActionSpec(
    "scale_out",
    scale_out,
    ScaleParams,
    "Raise kcops_desired_replicas (HPA) and optionally patch the Deployment's scale.",
)
