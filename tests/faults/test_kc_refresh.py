"""``?refresh=1`` on the live recommendation is an open door to the agent's loop no more:
it needs the token, and callers that ask together share one computation."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry import trace

from kcops.agent.component import AgentContext
from kcops.agent.config import parse_config
from kcops.agent.events import EventBus
from kcops.agent.kcrec.component import ROUTE, Recommender
from kcops.agent.store import Store
from kcops.auth import TokenCheck
from tests.clock import ManualClock
from tests.unit.agent.test_kcrec import T0, feed

TOKEN = "refresh-token"


def recommender(tmp_path: Path) -> Recommender:
    ctx = AgentContext(
        config=parse_config({"recommendation": {"min_samples": 10}}),
        store=Store(max_series=20_000, max_series_per_source=20_000),
        clock=ManualClock(T0 + 1000),
        bus=EventBus(),
        tracer=trace.get_tracer("test"),
        auth=TokenCheck(TOKEN),
        state_dir=tmp_path,
    )
    for process in range(20):  # 20 processes x 30 layers x the K(C) buckets
        for t in (T0 + 100, T0 + 900):
            feed(ctx.store, {str(i): [5, 50, 500] for i in range(30)}, t, process=f"p{process}")
    return Recommender(ctx, None)


def test_refresh_needs_the_token_and_concurrent_callers_share_one_run(tmp_path: Path) -> None:
    rec = recommender(tmp_path)

    async def scenario() -> tuple[list[int], list[int], int]:
        app = web.Application()
        app.add_routes(rec.routes())
        async with TestClient(TestServer(app)) as client:
            url = ROUTE + "?refresh=1"
            open_ = [(await client.get(url)).status for _ in range(3)]
            runs_before = rec.runs
            auth = {"Authorization": f"Bearer {TOKEN}"}
            answers = await asyncio.gather(*(client.get(url, headers=auth) for _ in range(16)))
            return open_, [a.status for a in answers], rec.runs - runs_before

    refused, statuses, runs = asyncio.run(scenario())
    assert refused == [401, 401, 401]
    assert statuses == [200] * 16
    assert runs == 1
