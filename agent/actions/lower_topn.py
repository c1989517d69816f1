"""``lower_topn``: shrink the attention budget N (OOM, memory pressure)."""

from __future__ import annotations

from kcops.agent.actions.base import ActionContext, ActionResult, ActionSpec
from kcops.agent.actions.topn import TopNParams, change_topn, look_lower, needs_topn
from kcops.agent.outcome import ActionName


async def lower_topn(ctx: ActionContext, p: TopNParams) -> ActionResult:
    return await change_topn(ctx, p, -1)


SPEC = ActionSpec(
    ActionName.LOWER_TOPN,
    lower_topn,
    TopNParams,
    "Lower the attention budget N by a step, within bounds.",
    precheck=needs_topn,
    look=look_lower,
)
