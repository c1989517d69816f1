"""Shared step of ``lower_topn`` and ``raise_topn``: move N within both sets of bounds."""

from __future__ import annotations

from pydantic import Field

from kcops.agent.actions.base import ActionContext, ActionResult, Check, Params
from kcops.agent.actions.outcome import Refusal
from kcops.errors import ActionRejected


class TopNParams(Params):
    step: int | None = Field(None, ge=1, description="default: actions.topn.step")


def needs_topn(check: Check, _: Params) -> None:
    check.engine.require("topn")


async def plan(ctx: ActionContext, p: TopNParams, direction: int) -> tuple[int, int]:
    """(current, wanted) N from the engine's state document, within both sets of bounds.

    Read-only: it is also the actions' ``look``, so a dry run refuses ``at_bound``
    exactly where an enforcing run would.
    """
    cfg = ctx.config.actions.topn
    state = await ctx.engine.state_doc()
    current = int(state["top_n"])
    lo, hi = cfg.min, cfg.max
    bounds = state.get("top_n_bounds")
    if isinstance(bounds, list | tuple) and len(bounds) == 2:
        lo, hi = max(lo, int(bounds[0])), min(hi, int(bounds[1]))
    step = p.step or cfg.step
    wanted = min(hi, max(lo, current + direction * step))
    if wanted == current:
        raise ActionRejected(
            f"top_n is {current}, already at the bound of [{lo}, {hi}]", Refusal.AT_BOUND
        )
    return current, wanted


async def look_lower(ctx: ActionContext, p: TopNParams) -> None:
    await plan(ctx, p, -1)


async def look_raise(ctx: ActionContext, p: TopNParams) -> None:
    await plan(ctx, p, +1)


async def change_topn(ctx: ActionContext, p: TopNParams, direction: int) -> ActionResult:
    current, wanted = await plan(ctx, p, direction)
    out = await ctx.engine.set_topn(wanted)
    return ActionResult(
        detail=f"top_n {current} -> {wanted}",
        before=out.get("before", {"top_n": current}),
        after=out.get("after", {"top_n": wanted}),
    )
