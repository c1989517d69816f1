"""Build a remediation component on a manual clock, a fake worker and a temp state dir."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from kcops.agent.actions.audit import read_audit
from kcops.agent.actions.remediation import Remediation
from kcops.agent.clock import ManualClock
from kcops.agent.component import AgentContext
from kcops.agent.config import parse_config
from kcops.agent.events import AlertTransition, EventBus, Step
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store
from kcops.auth import TokenCheck
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


async def make_rem(ctx: AgentContext) -> Remediation:
    import os

    os.environ["KCOPS_TOKEN"] = TOKEN
    rem = Remediation(ctx)
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


def counter(ctx: AgentContext, action: str, outcome: str) -> float | None:
    got = ctx.store.latest(
        SeriesKey.of("kcops_action_runs_total", {"action": action, "outcome": outcome})
    )
    return None if got is None else got[1]
