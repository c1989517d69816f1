"""Remediation: guarded actions, escalation ladders, supervision, audit.

:func:`build` returns the remediation components the configuration asks for:
the engine supervisor (when the agent launches the engine) and the
remediation component (runner, ladders, control API, Alertmanager webhook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext


def build(ctx: AgentContext) -> list[Any]:
    from kcops.agent.actions.engine import EngineAdmin
    from kcops.agent.actions.remediation import Remediation
    from kcops.agent.supervisor import Supervisor

    rem = Remediation(ctx)
    out: list[Any] = []
    command = ctx.config.engine.command
    if command:
        sup = Supervisor(
            command,
            ctx.config.actions.restart,
            clock=ctx.clock,
            store=ctx.store,
            engine=EngineAdmin(
                ctx.config.engine.url,
                ctx.config.engine.adapter,
                token=rem._token(),
                timeout_s=max(2.0, ctx.config.engine.timeout_s),
            ),
            page=rem.page,
        )
        ctx.services["supervisor"] = sup
        ctx.services["engine_pid"] = sup.pid
        ctx.services["engine_last_exit"] = sup.engine_last_exit
        out.append(sup)
    ctx.services["remediation"] = rem
    out.append(rem)
    return out
