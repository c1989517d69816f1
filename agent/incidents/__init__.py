"""Incident records: the evidence of each incident the agent pages for or restarts at.

``procs`` and ``stacks`` read the engine's tree, ``capture`` bounds them by the budget,
``series`` renders the store's window as OpenMetrics, ``book`` keeps records on disk,
``timeline`` reads the audit log, ``routes`` serves them; ``incidents`` is the component.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext
    from kcops.agent.engine import Engine
    from kcops.agent.engine.pid import EnginePid
    from kcops.agent.engine.supervisor import Supervisor
    from kcops.agent.incidents.incidents import Incidents


def build(
    ctx: AgentContext,
    engine: Engine,
    pids: EnginePid | None,
    supervisor: Supervisor | None,
) -> Incidents:
    from kcops.agent.incidents.incidents import Incidents
    from kcops.agent.incidents.output import engine_output
    from kcops.agent.remediation.remediation import AUDIT_FILE

    def root() -> int | None:
        if pids is not None:
            return pids.resolve()
        return supervisor.pid() if supervisor is not None else None

    return Incidents(
        ctx.config.incidents,
        ctx.state_dir / "incidents",
        ctx.store,
        ctx.bus,
        engine,
        root,
        engine_output(ctx.config, supervisor),
        ctx.state_dir / AUDIT_FILE,
        ctx.auth,
    )
