"""``evict_pod``: evict this agent's own pod through the Eviction API (the escalation
after a supervised engine's crash loop: restarts in place did not help, so the
Deployment schedules a fresh pod, possibly on another node with a healthy device).

The Eviction API honours the PodDisruptionBudget (429 while it allows no
disruption). Not a ladder step: the supervisor asks for it once, when it gives up
(``actions.restart.crash_loop: evict_pod``); on-call may run it by hand.
"""

from __future__ import annotations

from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Check,
    NoParams,
    Params,
    kube_token,
)
from kcops.agent.actions.kube import KubeClient
from kcops.agent.outcome import ActionName


def needs_token(check: Check, _: Params) -> None:
    kube_token(check, ActionName.EVICT_POD)


async def evict_pod(ctx: ActionContext, _: NoParams) -> ActionResult:
    info = await KubeClient(ctx.config.actions.kubernetes).evict_own_pod()
    return ActionResult(detail=f"evicted pod {info['namespace']}/{info['pod']}", data=dict(info))


SPEC = ActionSpec(
    ActionName.EVICT_POD,
    evict_pod,
    NoParams,
    "Evict this agent's pod (Eviction API): the escalation after an engine crash loop.",
    precheck=needs_token,
    ladder=False,
)
