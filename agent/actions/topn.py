"""``lower_topn`` (OOM, memory pressure) and ``raise_topn`` (accuracy drop under a tight N):
move the attention budget N by a step within both sets of bounds."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kcops.agent.actions.base import ActionContext, ActionResult, ActionSpec, Change, Check, Params
from kcops.agent.outcome import ActionName, ActionRejected, Refusal


class TopNState(BaseModel):
    """What top-N reads of the engine's state document: N and the engine's own bounds."""

    model_config = ConfigDict(extra="ignore")
    top_n: int
    top_n_bounds: tuple[int, int] | None = None


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
    state = TopNState.model_validate(await ctx.engine.state_doc())
    current, lo, hi = state.top_n, cfg.min, cfg.max
    if state.top_n_bounds is not None:
        lo, hi = max(lo, state.top_n_bounds[0]), min(hi, state.top_n_bounds[1])
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
    answer = await ctx.engine.set_topn(wanted)
    # The engine's own before/after when it gives them, else what was asked.
    out = Change.model_validate(
        {"before": {"top_n": current}, "after": {"top_n": wanted}, **answer}
    )
    return ActionResult(f"top_n {current} -> {wanted}", out.before, out.after)


async def lower_topn(ctx: ActionContext, p: TopNParams) -> ActionResult:
    return await change_topn(ctx, p, -1)


async def raise_topn(ctx: ActionContext, p: TopNParams) -> ActionResult:
    return await change_topn(ctx, p, +1)


LOWER_SPEC = ActionSpec(
    ActionName.LOWER_TOPN,
    lower_topn,
    TopNParams,
    "Lower the attention budget N by a step, within bounds.",
    precheck=needs_topn,
    look=look_lower,
)
RAISE_SPEC = ActionSpec(
    ActionName.RAISE_TOPN,
    raise_topn,
    TopNParams,
    "Raise the attention budget N by a step, within bounds.",
    precheck=needs_topn,
    look=look_raise,
)
