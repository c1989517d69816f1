"""The rules component: ticks over the store, publishes transitions, serves the control API."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry import trace

from kcops.agent import rules
from kcops.agent.component import AgentContext
from kcops.agent.config import parse_config
from kcops.agent.events import AlertTransition, EventBus
from kcops.agent.rules.engine import RuleEngine
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store
from kcops.auth import TokenCheck
from kcops.errors import ConfigError
from tests.clock import ManualClock

T0 = 1_700_000_000.0


def make_ctx(tmp_path: Path, rules_cfg: dict[str, Any] | None = None) -> AgentContext:
    return AgentContext(
        config=parse_config({"rules": rules_cfg or {}}),
        store=Store(),
        clock=ManualClock(T0),
        bus=EventBus(),
        tracer=trace.get_tracer("test"),
        auth=TokenCheck(None),
        state_dir=tmp_path,
    )


def feed_healthy(store: Store, t: float, up: float) -> None:
    store.append(SeriesKey.of("kcops_engine_up", {"engine": "e1"}), t, up)
    # The engine was ready; down when it stops answering (kcops_engine_state, one-hot).
    for state, on in (("starting", 0.0), ("ready", up), ("hung", 0.0), ("down", 1.0 - up)):
        store.append(SeriesKey.of("kcops_engine_state", {"engine": "e1", "state": state}), t, on)


def test_engine_down_fires_after_5s_and_resolves(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    (comp,) = rules.build(ctx)
    assert [r.name for r in comp.ruleset.rules]
    seen: list[AlertTransition] = []
    ctx.bus.subscribe(seen.append)

    async def run() -> None:
        await comp.start()
        for i in range(60):
            t = T0 + i
            feed_healthy(ctx.store, t, 0.0 if 10 <= i < 50 else 1.0)
            await comp.tick(t)
        await comp.stop()

    asyncio.run(run())
    got = [(tr.t - T0, tr.state) for tr in seen if tr.alertname == "KcopsEngineDown"]
    assert got == [(10, "pending"), (15, "firing"), (50, "inactive")]
    firing = next(tr for tr in seen if tr.state == "firing")
    assert [s.action for s in firing.remediation] == ["restart_worker"]
    assert firing.labels["engine"] == "e1" and firing.labels["severity"] == "page"
    names = [r.name for r in comp.ruleset.rules]
    assert "KcopsEngineDown" in names and len(names) == 16
    # state series for the exporter and for rules over ALERTS
    key = SeriesKey.of("kcops_alert_state", {"alertname": "KcopsEngineDown", "state": "inactive"})
    assert ctx.store.latest(key) == (T0 + 59, 1.0)
    alerts_key = SeriesKey.of(
        "ALERTS",
        {
            "alertname": "KcopsEngineDown",
            "alertstate": "firing",
            "engine": "e1",
            "severity": "page",
        },
    )
    assert ctx.store.latest(alerts_key) is None  # stale-marked after resolving
    assert ctx.store.latest(alerts_key, at=T0 + 49) == (T0 + 49, 1.0)


def is_firing(engine: RuleEngine, alertname: str, labels: dict[str, str] | None = None) -> bool:
    """An instance of ``alertname`` fires whose labels include ``labels``."""
    want = (labels or {}).items()
    return any(
        i.state == "firing" and want <= dict(i.labels).items()
        for i in engine.states.get(alertname, {}).values()
    )


def test_is_firing_active_and_routes(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    (comp,) = rules.build(ctx)

    async def run() -> tuple[Any, Any]:
        for i in range(40):
            feed_healthy(ctx.store, T0 + i, 0.0)
            await comp.tick(T0 + i)
        app = web.Application()
        app.add_routes(comp.routes())
        async with TestClient(TestServer(app)) as client:
            a = await (await client.get("/api/v1/alerts")).json()
            r = await (await client.get("/api/v1/rules")).json()
        return a, r

    alerts, rules_doc = asyncio.run(run())
    assert is_firing(comp.engine, "KcopsEngineDown")
    assert is_firing(comp.engine, "KcopsEngineDown", {"engine": "e1"})
    assert not is_firing(comp.engine, "KcopsEngineDown", {"engine": "e2"})
    assert not is_firing(comp.engine, "KcopsDeviceMemoryHigh")
    (active,) = comp.engine.active()
    assert active["state"] == "firing" and active["active_since"] == T0
    assert alerts["alerts"][0]["alertname"] == "KcopsEngineDown"
    assert {r["name"] for r in rules_doc["rules"]} == set([r.name for r in comp.ruleset.rules])
    down = next(r for r in rules_doc["rules"] if r["name"] == "KcopsEngineDown")
    assert down["state"] == "firing" and down["health"] == "ok"
    status = comp.status()
    assert status["healthy"] and "1 firing" in status["summary"]


def test_config_params_override_and_bad_files_refuse_to_start(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"params": {"p99_ttft_seconds": 5}})
    (comp,) = rules.build(ctx)
    assert "> 5" in comp.ruleset.get("KcopsP99LatencyHigh").expr
    with pytest.raises(ConfigError, match="unknown parameter"):
        rules.build(make_ctx(tmp_path, {"params": {"nope": 1}}))
    bad = tmp_path / "bad.yaml"
    bad.write_text("groups: [{name: g, rules: [{alert: X, expr: 'foo(bar)'}]}]")
    with pytest.raises(ConfigError, match="rule 'X'"):
        rules.build(make_ctx(tmp_path, {"file": str(bad)}))
    assert rules.build(make_ctx(tmp_path, {"enabled": False})) == []


def test_an_evaluation_error_is_reported_not_raised(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text("groups: [{name: g, rules: [{alert: X, expr: 'a / on () b'}]}]")
    ctx = make_ctx(tmp_path, {"file": str(f)})
    (comp,) = rules.build(ctx)
    for lab in ("1", "2"):
        ctx.store.append(SeriesKey.of("a", {"x": lab}), T0, 1.0)
    ctx.store.append(SeriesKey.of("b"), T0, 1.0)
    asyncio.run(comp.tick(T0))
    st = comp.status()
    assert not st["healthy"] and "many-to-one" in st["errors"]["X"]


def test_recording_rules_feed_later_rules(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        "groups: [{name: g, rules: ["
        "{record: 'job:x:sum', expr: 'sum by (job) (x)', labels: {src: rec}},"
        "{alert: High, expr: 'job:x:sum > 3'}]}]"
    )
    ctx = make_ctx(tmp_path, {"file": str(f)})
    (comp,) = rules.build(ctx)
    for i, lab in enumerate(("1", "2")):
        ctx.store.append(SeriesKey.of("x", {"job": "a", "i": lab}), T0, float(i + 2))
    asyncio.run(comp.tick(T0))
    rec = SeriesKey.of("job:x:sum", {"job": "a", "src": "rec"})
    assert ctx.store.latest(rec) == (T0, 5.0)
    assert is_firing(comp.engine, "High", {"job": "a", "src": "rec"})


# About a second of evaluation each (under the per-evaluation budget), so a tick's
# shared budget of 50 ms is always spent by the first of them.
COSTLY = "sum_over_time(sum(max_over_time(vector(1)[5m:1s]))[30m:10s])"


def test_the_tick_budget_is_shared_by_all_rules_and_groups_take_turns(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    groups = ", ".join(
        f"{{name: g{g}, rules: [{{record: r{g}a, expr: '{COSTLY}'}}, "
        f"{{record: r{g}b, expr: 'vector(1)'}}]}}"
        for g in range(3)
    )
    f.write_text(f"groups: [{groups}]")
    ctx = make_ctx(tmp_path, {"file": str(f), "tick_budget_s": 0.05})
    (comp,) = rules.build(ctx)
    health = comp.engine.health
    asyncio.run(comp.tick(T0))
    # The first costly rule ran into the tick's bound, the rule after it was not run,
    # and the other groups were not reached: they stay due.
    assert "shared evaluation budget" in (health["r0a"].error or "")
    assert "not evaluated" in (health["r0b"].error or "")
    assert health["r1a"].last_eval is None and health["r2a"].last_eval is None
    asyncio.run(comp.tick(T0 + 1))
    # The next tick starts with the group the spent budget left.
    assert health["r1a"].last_eval == T0 + 1
    assert health["r0a"].last_eval == T0


def test_the_tick_budget_s_cuts_and_the_template_bound_are_exported(tmp_path: Path) -> None:
    f = tmp_path / "r.yaml"
    f.write_text(
        f"groups: [{{name: g, rules: [{{record: a, expr: '{COSTLY}'}}, "
        "{record: b, expr: 'vector(1)'}, {record: c, expr: 'vector(2)'}]}]"
    )
    ctx = make_ctx(tmp_path, {"file": str(f), "tick_budget_s": 0.05})
    (comp,) = rules.build(ctx)
    asyncio.run(comp.tick(T0))

    def value(name: str, **labels: str) -> float | None:
        got = ctx.store.latest(SeriesKey.of(name, labels))
        return None if got is None else got[1]

    # a stopped at the tick's bound; b and c not evaluated.
    assert value("kcops_rule_evaluations_cut_total", outcome="stopped") == 1
    assert value("kcops_rule_evaluations_cut_total", outcome="not_evaluated") == 2
    assert value("kcops_template_output_max_bytes") == 64 * 1024
    assert value("kcops_template_truncated_total") == 0
