"""The assembled agent in-process: ticks, /metrics, status, failure isolation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import httpx

from kcops.agent.app import Agent
from kcops.agent.config import parse_config
from kcops.agent.samples import Sample


class AlwaysBroken:
    name = "broken"

    def collect(self, now: float) -> Iterable[Sample]:
        raise ValueError("broken on purpose")


def test_agent_serves_metrics_while_a_collector_raises_every_tick(tmp_path: Path) -> None:
    cfg = parse_config(
        {"agent": {"listen": "127.0.0.1:0", "state_dir": str(tmp_path), "tick_s": 0.05}}
    )
    agent = Agent(cfg, token=None, extra_collectors=[AlwaysBroken()])

    async def go() -> tuple[str, dict, int]:
        task = asyncio.create_task(agent.run(install_signals=False))
        while agent.ticks_done < 5:
            await asyncio.sleep(0.02)
        base = f"http://127.0.0.1:{agent.bound_port}"
        async with httpx.AsyncClient() as client:
            metrics = (await client.get(base + "/metrics")).text
            status = (await client.get(base + "/api/v1/status")).json()
            ready = (await client.get(base + "/readyz")).status_code
        agent.request_stop()
        await asyncio.wait_for(task, 5)
        return metrics, status, ready

    metrics, status, ready = asyncio.run(go())
    assert ready == 200
    assert "kcops_agent_tick_seconds_count" in metrics
    assert 'kcops_process_resident_memory_bytes{process="agent"}' in metrics
    assert 'kcops_collector_errors_total{collector="broken",reason="exception"}' in metrics
    coll = status["components"]["collectors"]["collectors"]
    assert coll["broken"]["ok"] is False and coll["broken"]["errors"] >= 4
    assert coll["self"]["ok"] is True
    assert status["ticks"] >= 5 and status["series"] > 0
