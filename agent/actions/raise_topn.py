"""``raise_topn``: grow the attention budget N (accuracy drop under a tight N)."""

from __future__ import annotations

from kcops.agent.actions.base import ActionContext, ActionResult, ActionSpec
from kcops.agent.actions.topn import TopNParams, change_topn, look_raise, needs_topn
from kcops.agent.outcome import ActionName


async def raise_topn(ctx: ActionContext, p: TopNParams) -> ActionResult:
    return await change_topn(ctx, p, +1)


SPEC = ActionSpec(
    ActionName.RAISE_TOPN,
    raise_topn,
    TopNParams,
    "Raise the attention budget N by a step, within bounds.",
    precheck=needs_topn,
    look=look_raise,
)
