"""Build a remediation component on a manual clock, a fake worker and a temp state dir."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kcops.agent.actions.base import Registry, SupervisorHandle
from kcops.agent.actions.registry import builtin_actions
from kcops.agent.component import AgentContext
from kcops.agent.config import Config, parse_config
from kcops.agent.engine import Engine
from kcops.agent.events import AlertTransition, EventBus, Step
from kcops.agent.promql.model import RuleError
from kcops.agent.remediation.audit import AuditLog
from kcops.agent.remediation.auditread import read_audit
from kcops.agent.remediation.remediation import Remediation
from kcops.agent.rules.loader import RuleSet, ruleset_from_config
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store
from kcops.auth import TokenCheck
from tests.clock import ManualClock
from tests.unit.actions.fakeworker import TOKEN


def make_ctx(
    state_dir: Path, engine_url: str | None, clock: ManualClock, **actions: Any
) -> tuple[AgentContext, InMemorySpanExporter]:
    cfg = parse_config(
        {
            "agent": {"state_dir": str(state_dir)},
            "engine": {"url": engine_url, "adapter": "kcops" if engine_url else "auto"},
            "actions": actions,
        }
    )
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    ctx = AgentContext(
        config=cfg,
        store=Store(),
        clock=clock,
        bus=EventBus(),
        tracer=provider.get_tracer("test"),
        auth=TokenCheck(TOKEN),
        state_dir=state_dir,
    )
    return ctx, spans


def ladders(config: Config, registry: Registry) -> RuleSet | None:
    """The configured rule set, as the app's preflight loads it; a bad file: no ladders."""
    try:
        return ruleset_from_config(config, registry.ladder_params())
    except RuleError:
        return None


class OwnEngine(Remediation):
    """A remediation with an engine of its own, closed when it stops."""

    async def stop(self) -> None:
        await super().stop()
        await self.engine.aclose()


def build_rem(
    ctx: AgentContext, registry: Registry | None = None, supervisor: SupervisorHandle | None = None
) -> Remediation:
    """A remediation as the app builds it, with its own engine and the configured ladders."""
    reg = registry or builtin_actions()
    os.environ["KCOPS_TOKEN"] = TOKEN
    engine = Engine.configured_by(ctx.config.engine, ctx.auth.token, ctx.clock())
    rules = ladders(ctx.config, reg)
    return OwnEngine(ctx, reg, engine=engine, supervisor=supervisor, ruleset=rules)


async def make_rem(ctx: AgentContext, registry: Registry | None = None) -> Remediation:
    rem = build_rem(ctx, registry)
    await rem.start()
    return rem


def transition(
    name: str,
    state: str,
    t: float,
    steps: tuple[Step, ...] = (),
    labels: dict[str, str] | None = None,
) -> AlertTransition:
    previous = "firing" if state == "inactive" else "pending"
    return AlertTransition(
        alertname=name,
        labels={"alertname": name, **(labels or {})},
        previous=previous,  # type: ignore[arg-type]
        state=state,  # type: ignore[arg-type]
        t=t,
        remediation=steps,
    )


async def settle(rem: Remediation) -> None:
    """Let action tasks started by the last call finish, and their records reach the disk
    (the audit log's writer thread writes them)."""
    for _ in range(50):
        if not rem.runner.tasks:
            break
        await asyncio.wait(list(rem.runner.tasks), timeout=5)
    await rem.audit.sync()


def audit(rem: Remediation, kind: str | None = None) -> list[dict[str, Any]]:
    return [r for r in read_audit(rem.audit.path) if kind is None or r.get("kind") == kind]


def unsynced(log: AuditLog) -> int:
    """Records appended but not yet known on disk (held in memory included)."""
    return log._seq - log._synced


def counter(ctx: AgentContext, action: str, outcome: str) -> float | None:
    got = ctx.store.latest(
        SeriesKey.of("kcops_action_runs_total", {"action": action, "outcome": outcome})
    )
    return None if got is None else got[1]
