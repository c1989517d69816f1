"""Dry-run decides as enforce does for every refusal known before acting (issue 10 item 2):
top-N already at its bound (read from the engine), a missing Kubernetes token file, an
engine capability. Same outcome and reason code in enforce, in a dry-run agent and in a
one-off dry run; a would-refuse spends no cooldown or budget either, so asked again it is
refused for its reason, not skipped for a cooldown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kcops.agent.remediation.runner import Run
from tests.clock import ManualClock
from tests.unit.actions.fakevllm import FakeVllm
from tests.unit.actions.fakeworker import FakeWorker
from tests.unit.actions.harness import audit, make_ctx, make_rem

MODES = ("enforce", "dry-run agent", "one-off dry run")


def _worker(top_n: int) -> Callable[[], Any]:
    def make() -> FakeWorker:
        w = FakeWorker()
        w.state["top_n"] = top_n  # bounds [16, 256], config bounds [16, 1024]
        return w

    return make


def _cfg(tmp: Path, actions: dict[str, Any]) -> dict[str, Any]:
    out = dict(actions)
    missing = str(tmp / "no-such-token")
    out["kubernetes"] = {"token_file": missing, "namespace": "ns", "pod_name": "p"}
    return out


# (id, engine, adapter, action, params, actions config, expected refusal or None)
CASES = [
    ("lower_topn at min", _worker(16), "kcops", "lower_topn", {}, {}, "at_bound"),
    ("raise_topn at max", _worker(256), "kcops", "raise_topn", {}, {}, "at_bound"),
    ("raise_topn step past the engine bound", _worker(250), "kcops", "raise_topn", {"step": 16},
     {}, None),
    ("lower_topn within bounds", _worker(64), "kcops", "lower_topn", {}, {}, None),
    ("restart_worker kubernetes, no token file", _worker(64), "kcops", "restart_worker", {},
     {"restart": {"mode": "kubernetes"}}, "not_configured"),
    ("scale_out patching a deployment, no token file", _worker(64), "kcops", "scale_out", {},
     {"scale": {"deployment": "serving"}}, "not_configured"),
    ("scale_out raising an HPA without a fleet lease", _worker(64), "kcops", "scale_out", {},
     {"scale": {"hpa": "serving"}}, "unsupported"),
    ("scale_out on a redis lease with no URL", _worker(64), "kcops", "scale_out", {},
     {"scale": {"lease": {"backend": "redis"}}}, "unsupported"),
    ("lower_topn on vllm: no top-N control", FakeVllm, "vllm", "lower_topn", {}, {},
     "unsupported"),
    ("evict lru on vllm: only a full reset", FakeVllm, "vllm", "evict_cache",
     {"policy": "lru", "fraction": 0.5, "redis": False}, {}, "unsupported"),
]  # fmt: skip


async def _submit(rem: Any, mode: str, action: str, params: dict[str, Any]) -> Run:
    run = rem.runner.submit(action, params, dry_run=mode == "one-off dry run")
    if run.task is not None:
        await run.task
    return run


@pytest.mark.parametrize(
    ("make", "adapter", "action", "params", "actions", "refusal"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_dry_run_refuses_where_enforce_refuses(
    tmp_path: Path,
    make: Callable[[], Any],
    adapter: str,
    action: str,
    params: dict[str, Any],
    actions: dict[str, Any],
    refusal: str | None,
) -> None:
    async def one(mode: str) -> tuple[Run, Any, list[dict[str, Any]]]:
        server = make()
        url = await server.start()
        clock = ManualClock()
        agent_mode = "dry-run" if mode == "dry-run agent" else "enforce"
        state = tmp_path / mode.replace(" ", "-")
        ctx, _ = make_ctx(state, url, clock, mode=agent_mode, **_cfg(tmp_path, actions))
        ctx.config.engine.adapter = adapter
        rem = await make_rem(ctx)
        try:
            await rem.engine.resolve()
            before = server.snapshot() if hasattr(server, "snapshot") else None
            run = await _submit(rem, mode, action, params)
            guards = (dict(rem.guards.cooldown_until), list(rem.guards.runs))
            again = await _submit(rem, mode, action, params)
            if mode != "enforce" and before is not None:
                assert server.snapshot() == before  # a dry run changes nothing
        finally:
            await rem.stop()
            await server.stop()
        return run, (guards, again), audit(rem, "action")

    async def body() -> None:
        got = {mode: await one(mode) for mode in MODES}
        for mode, (run, (guards, again), recs) in got.items():
            if refusal is None:
                want = "ok" if mode == "enforce" else "dry_run"
                assert run.outcome == want, (mode, run.outcome, run.error)
                continue
            assert (run.outcome, run.refusal) == ("refused", refusal), (mode, run.error)
            assert guards == ({}, []), (mode, guards)  # no cooldown, no budget spent
            # asked again: refused for its reason, not held back by a cooldown
            assert (again.outcome, again.refusal) == ("refused", refusal), (mode, again.error)
            assert [r["outcome"] for r in recs] == ["refused", "refused"]
            if mode != "enforce":
                assert run.result is not None
                assert run.result.detail == f"dry run: would refuse: {run.error}"
        if refusal is not None:
            assert len({got[m][0].error for m in MODES}) == 1, {m: got[m][0].error for m in MODES}

    asyncio.run(body())


def test_a_dry_run_agent_spends_its_guards_only_for_what_it_would_do(tmp_path: Path) -> None:
    """A dry-run agent keeps cooldown and budget as if it acted (its log shows what an
    enforcing agent would decide), but only for runs that would act."""

    async def body() -> None:
        w = FakeWorker()
        w.state["top_n"] = 64
        url = await w.start()
        clock = ManualClock()
        ctx, _ = make_ctx(tmp_path, url, clock, mode="dry-run")
        rem = await make_rem(ctx)
        try:
            run = await _submit(rem, "dry-run agent", "lower_topn", {})
            assert run.outcome == "dry_run"
            assert [a for _, a in rem.guards.runs] == ["lower_topn"]
            again = await _submit(rem, "dry-run agent", "lower_topn", {})
            assert again.outcome == "skipped_cooldown"  # as an enforcing agent would be
        finally:
            await rem.stop()
            await w.stop()
        assert w.state["top_n"] == 64

    asyncio.run(body())
