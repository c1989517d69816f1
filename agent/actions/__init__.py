"""Remediation: guarded actions, escalation ladders, supervision, audit.

:func:`build` returns the remediation components the configuration asks for:
the engine supervisor (when the agent launches the engine) and the
remediation component (runner, ladders, control API, Alertmanager webhook).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcops.agent.collectors.enginepid import EnginePid
    from kcops.agent.component import AgentContext
    from kcops.agent.engine import Engine


def build(ctx: AgentContext, engine: Engine, pids: EnginePid | None = None) -> list[Any]:
    from kcops.agent.actions.remediation import Remediation
    from kcops.agent.supervisor import Supervisor

    out: list[Any] = []
    sup = None
    command = ctx.config.engine.command
    if command:
        sup = Supervisor(
            command,
            ctx.config.actions.restart,
            clock=ctx.clock,
            store=ctx.store,
            engine=engine,
            page=lambda message, **kw: rem.page(message, **kw),
        )
        if pids is not None:
            pids.supervisor_pid = sup.pid  # the collectors' pid source, built before this
        out.append(sup)
    rem = Remediation(ctx, engine=engine, supervisor=sup)
    out.append(rem)
    return out
