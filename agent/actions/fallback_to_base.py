"""``fallback_to_base`` and its inverse ``restore_route``: switch the engine's routing.

Remediation runs ``restore_route`` itself (:mod:`.restore`) once the alert that
caused the fallback has stayed resolved for ``actions.fallback.hold_s``.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from kcops.agent.actions.base import (
    ActionContext,
    ActionResult,
    ActionSpec,
    Change,
    Check,
    NoParams,
    Params,
)
from kcops.agent.outcome import ActionName


class FallbackParams(Params):
    hold_s: float | None = Field(
        None,
        ge=0,
        description="restore after the alert stayed resolved this long "
        "(default: actions.fallback.hold_s)",
    )


def hold_of(params: Mapping[str, object], default_s: float) -> float:
    value = params.get("hold_s")
    return float(value) if isinstance(value, int | float) else default_s


def needs_route(check: Check, _: Params) -> None:
    check.engine.require("route")


async def fallback_to_base(ctx: ActionContext, p: FallbackParams) -> ActionResult:
    out = Change.model_validate(await ctx.engine.set_route("fallback"))
    hold = ctx.config.actions.fallback.hold_s if p.hold_s is None else p.hold_s
    return ActionResult(
        "routing long requests to the base model", out.before, out.after, {"restore_after_s": hold}
    )


async def restore_route(ctx: ActionContext, p: NoParams) -> ActionResult:
    out = Change.model_validate(await ctx.engine.set_route("normal"))
    return ActionResult("normal routing restored", out.before, out.after)


SPEC = ActionSpec(
    ActionName.FALLBACK_TO_BASE,
    fallback_to_base,
    FallbackParams,
    "Route requests to the base model; restored automatically after the alert's hold time.",
    precheck=needs_route,
)
RESTORE_SPEC = ActionSpec(
    ActionName.RESTORE_ROUTE,
    restore_route,
    NoParams,
    "Route requests normally again (undo fallback).",
    precheck=needs_route,
)
