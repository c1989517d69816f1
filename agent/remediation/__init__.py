"""Remediation: alerts in, escalation ladders, the guarded runner, audit and state."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcops.agent.outcome import ActionName

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext, Component
    from kcops.agent.engine import Engine
    from kcops.agent.engine.pid import EnginePid
    from kcops.agent.remediation.remediation import Remediation
    from kcops.agent.rules.loader import RuleSet


def build(
    ctx: AgentContext,
    engine: Engine,
    pids: EnginePid | None,
    ruleset: RuleSet | None,
) -> list[Component]:
    """Supervisor (with ``engine.command``) and remediation. ``ruleset``: the rule set
    preflight loaded, whose ladders remediation climbs (alerts reach it on the bus)."""
    from kcops.agent.engine.supervisor import Supervisor
    from kcops.agent.remediation.remediation import Remediation

    out: list[Component] = []
    sup = None
    command = ctx.config.engine.command
    if command:
        sup = Supervisor(
            command,
            ctx.config.actions.restart,
            clock=ctx.clock,
            store=ctx.store,
            engine=engine,
            page=lambda message, **kw: crash_loop(rem, message, **kw),
        )
        if pids is not None:
            pids.supervisor_pid = sup.pid  # the collectors' pid source, built before this
        out.append(sup)
    rem = Remediation(
        ctx,
        engine=engine,
        supervisor=sup,
        ruleset=ruleset,
    )
    out.append(rem)
    return out


def crash_loop(rem: Remediation, message: str, **kw: int | None) -> None:
    """The supervisor gave up (a crash loop): page; with ``actions.restart.crash_loop:
    evict_pod``, also evict this pod, as a guarded, audited run."""
    rem.pager.page(message, **kw)  # type: ignore[arg-type]
    if rem.config.actions.restart.crash_loop == ActionName.EVICT_POD:
        rem.runner.submit(ActionName.EVICT_POD, reason=message)
