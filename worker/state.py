"""What the worker's HTTP handlers share: the engine, its controls and the live counters."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from kcops.auth import TokenCheck
from kcops.tenant import TenantLabels
from kcops.worker.control import Control
from kcops.worker.engine import BatchEngine
from kcops.worker.faults import Faults
from kcops.worker.metrics import LiveState, WorkerMetrics
from kcops.worker.redis_tier import RedisTier


@dataclass
class WorkerState:
    engine: BatchEngine
    control: Control
    faults: Faults
    metrics: WorkerMetrics
    model_name: str
    context_tokens: int
    tokens: TokenCheck
    redis: RedisTier | None = None
    cache_ttl_s: float = 3600.0
    enable_faults: bool = False
    admitting: bool = True
    in_flight: int = 0
    tenants: TenantLabels = field(default_factory=TenantLabels)


STATE = web.AppKey("kcops_worker_state", WorkerState)


def state_of(request: web.Request) -> WorkerState:
    return request.app[STATE]


def live_state(state: WorkerState) -> LiveState:
    eng = state.engine
    return LiveState(
        waiting=eng.waiting,
        running=eng.running,
        kv_cache_usage_perc=min(1.0, eng.cache.usage_ratio),
        top_n=state.control.budget.top_n,
        fallback=state.control.mode == "fallback",
        shadow_agreement=eng.shadow_agreement,
        kv_bytes=eng.kv_bytes,
    )


async def hang_gate(state: WorkerState) -> None:
    """A hung worker (fault drill) does not answer: wait until the drill is cleared."""
    while state.faults.hang:
        await asyncio.sleep(0.2)
