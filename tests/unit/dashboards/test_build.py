"""Dashboards: in sync with the builder, valid PromQL, only series something exports."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from aiohttp import web
from click.testing import CliRunner
from grafana_foundation_sdk.models.dashboard import Dashboard as SdkDashboard
from prometheus_client.parser import text_string_to_metric_families

from kcops.agent.rules.loader import RuleSet, default_rules_path, load_rules, load_rules_data
from kcops.agent.signals import SIGNALS
from kcops.cli import cli
from kcops.dashboards.build import build_all
from kcops.worker.metrics import LiveState, WorkerMetrics
from tests.services import free_port

REPO = Path(__file__).resolve().parents[3]


def all_exprs() -> list[str]:
    return [
        t["expr"] for model in build_all().values() for p in model["panels"] for t in p["targets"]
    ]


def _series(name: str, kind: str) -> set[str]:
    """The series a metric family is scraped as: a histogram only as its parts."""
    if kind == "histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
    return {name}


def exported_series() -> set[str]:
    """Every series kcops's agent, its reference worker or vLLM exports."""
    agent = {s for name, meta in SIGNALS.items() for s in _series(name, meta.type)}
    page = (REPO / "tests" / "fixtures" / "vllm_metrics.txt").read_text()
    vllm = {s.name for family in text_string_to_metric_families(page) for s in family.samples}
    # Every optional gauge present: the worker leaves some out while it has no value.
    live = LiveState(
        waiting=0,
        running=0,
        kv_cache_usage_perc=0.0,
        top_n=0,
        fallback=False,
        shadow_agreement=1.0,
        kv_bytes=0,
    )
    worker: set[str] = set()
    for family in WorkerMetrics("m", lambda: live).registry.collect():
        # prometheus_client names a counter's family without the _total of its series.
        name = f"{family.name}_total" if family.type == "counter" else family.name
        worker |= _series(name, family.type)
    return agent | vllm | worker


def recorded_series(ruleset: RuleSet) -> set[str]:
    """The series the rule set's recording rules write (``kcops:...``)."""
    return {r.name for r in ruleset.rules if r.kind == "recording"}


def unknown_series(expr: str, known: set[str]) -> list[str]:
    """The series ``expr`` selects that ``known`` lacks; parsing it raises if it is not PromQL."""
    selected: list[str] = []

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            selected.append(node.name or str(node))  # a selector without a name is unknown

    promql_parser.walk(promql_parser.parse(expr), visit)
    return [name for name in selected if name not in known]


@pytest.fixture(scope="module")
def known_series() -> set[str]:
    fleet = load_rules(default_rules_path().parent / "records.yaml")  # the fleet's records
    return (
        exported_series()
        | recorded_series(load_rules(default_rules_path()))
        | recorded_series(fleet)
    )


@pytest.mark.parametrize("expr", all_exprs())
def test_every_query_parses_and_reads_only_exported_series(
    expr: str, known_series: set[str]
) -> None:
    assert unknown_series(expr, known_series) == [], (
        "not exported by kcops (agent/signals.py), its worker (worker/metrics.py) or vLLM "
        "(tests/fixtures/vllm_metrics.txt), nor recorded by alerts/rules.yaml"
    )


def test_the_series_check_refuses_what_nothing_exports_and_takes_recorded_series() -> None:
    exported = exported_series()
    assert unknown_series("sum(rate(kcops_no_such_total[5m]))", exported) == ["kcops_no_such_total"]
    # A histogram is scraped as _bucket, _sum and _count, never under its own name.
    assert unknown_series("rate(kcops_ttft_seconds_sum[5m])", exported) == []
    assert unknown_series("rate(kcops_ttft_seconds[5m])", exported) == ["kcops_ttft_seconds"]
    assert unknown_series('{job="kcops"}', exported) == ['{job="kcops"}']
    # Each source counts: vLLM's page only, the worker only.
    assert unknown_series("rate(vllm:num_preemptions_total[5m])", exported) == []
    assert unknown_series("kcops_worker_kv_bytes", exported) == []
    with pytest.raises(ValueError):
        unknown_series("sum(rate(kcops_ttft_seconds_sum[5m])", exported)
    # A recording rule's series is known once a loaded rule set records it.
    record = "kcops:cost_full:rate1h"
    rule = {"record": record, "expr": "sum(rate(kcops_cost_full_total[1h]))"}
    ruleset = load_rules_data({"groups": [{"name": "cost", "rules": [rule]}]})
    assert unknown_series(f"sum({record})", exported) == [record]
    assert unknown_series(f"sum({record})", exported | recorded_series(ruleset)) == []


def test_schema_version_is_the_sdks() -> None:
    """No hand-written number: the model says the schema its SDK types describe."""
    assert {m["schemaVersion"] for m in build_all().values()} == {SdkDashboard().schema_version}


def test_layout_fits_the_grid_and_ids_are_unique() -> None:
    for model in build_all().values():
        ids = [p["id"] for p in model["panels"]]
        assert len(ids) == len(set(ids))
        for p in model["panels"]:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24
            assert [t["refId"] for t in p["targets"]] == [
                chr(ord("A") + i) for i in range(len(p["targets"]))
            ]
        names = [v["name"] for v in model["templating"]["list"]]
        assert names == ["datasource", "instance"]


def _panel(models: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for m in models.values() for p in m["panels"] if p["title"] == title)


def _red_lines(panel: dict[str, Any]) -> list[float]:
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    return [s["value"] for s in steps if s["color"] == "red"]


def test_thresholds_and_notes_follow_the_rule_params(tmp_path: Path) -> None:
    title = "Device memory used"
    default = _panel(build_all(), title)
    assert _red_lines(default) == [0.9]
    assert "0.9" in default["description"] and "after 1m" in default["description"]
    moved = _panel(
        build_all(load_rules(default_rules_path(), {"device_memory_ratio": 0.75})), title
    )
    assert _red_lines(moved) == [0.75]
    assert "0.75" in moved["description"]
    # The same override through the CLI, as `alerts export --param` takes it.
    res = CliRunner().invoke(
        cli,
        ["dashboards", "build", "--out", str(tmp_path), "--param", "device_memory_ratio=0.6"],
    )
    assert res.exit_code == 0, res.output
    written = json.loads((tmp_path / "kcops-serving.json").read_text())
    assert _red_lines(_panel({"s": written}, title)) == [0.6]


def test_query_windows_follow_the_rule_params() -> None:
    def exprs(models: dict[str, Any], title: str) -> list[str]:
        return [t["expr"] for t in _panel(models, title)["targets"]]

    default = build_all()
    assert all("[5m]" in e for e in exprs(default, "Time to first token p99"))
    assert exprs(default, "Attention errors") == [
        'sum by (kind) (increase(kcops_attention_errors_total{instance=~"$instance"}[1h]))'
    ]
    moved = build_all(
        load_rules(
            default_rules_path(),
            {"rate_window": "10m", "attention_errors_window": "2h", "baseline_window": "3h"},
        )
    )
    assert all("[10m]" in e for e in exprs(moved, "Time to first token p99"))
    assert all("[10m]" in e and "[5m]" not in e for e in exprs(moved, "Prefix cache hit rate"))
    assert all("[2h]" in e for e in exprs(moved, "Attention errors"))
    assert "within 2h" in _panel(moved, "Attention errors")["description"]
    assert all("[3h]" in e for e in exprs(moved, "Engine restarts / OOM (3h)"))
    # No query keeps a literal window: each one is a rule parameter.
    for model in moved.values():
        for p in model["panels"]:
            for t in p["targets"]:
                assert not re.search(r"\[(5m|1m|1h)\]", t["expr"]), t["expr"]


def test_unknown_param_is_a_usage_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        cli, ["dashboards", "build", "--out", str(tmp_path), "--param", "no_such=1"]
    )
    assert res.exit_code == 2 and "no_such" in res.output


class GrafanaStandIn:
    """Grafana cannot be installed here: this serves its documented
    ``POST /api/dashboards/db`` contract and records what it received."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.received: list[dict[str, Any]] = []

    async def save(self, request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"message": "Unauthorized"}, status=401)
        body = await request.json()
        self.received.append(body)
        uid = body["dashboard"]["uid"]
        return web.json_response(
            {
                "id": len(self.received),
                "uid": uid,
                "url": f"/d/{uid}",
                "status": "success",
                "version": 1,
                "slug": uid,
            }
        )


@pytest.fixture
def grafana() -> Iterator[tuple[str, GrafanaStandIn]]:
    import asyncio

    stand_in = GrafanaStandIn("glsa_test")
    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/api/dashboards/db", stand_in.save)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{port}", stand_in
    loop.call_soon_threadsafe(loop.stop)
    t.join(5)


def test_push_uploads_every_dashboard_with_overwrite(grafana: tuple[str, GrafanaStandIn]) -> None:
    url, stand_in = grafana
    res = CliRunner().invoke(
        cli,
        ["dashboards", "push", "--grafana-url", url, "--folder-uid", "ops"],
        env={"GRAFANA_TOKEN": "glsa_test"},
    )
    assert res.exit_code == 0, res.output
    assert sorted(b["dashboard"]["uid"] for b in stand_in.received) == sorted(
        m["uid"] for m in build_all().values()
    )
    assert all(b["overwrite"] is True and b["folderUid"] == "ops" for b in stand_in.received)


def test_push_with_wrong_token_fails_and_without_token_is_usage_error(
    grafana: tuple[str, GrafanaStandIn],
) -> None:
    url, _ = grafana
    res = CliRunner().invoke(
        cli, ["dashboards", "push", "--grafana-url", url], env={"GRAFANA_TOKEN": "wrong"}
    )
    assert res.exit_code == 1 and "refused by Grafana" in res.output
    res = CliRunner().invoke(
        cli, ["dashboards", "push", "--grafana-url", url], env={"GRAFANA_TOKEN": ""}
    )
    assert res.exit_code == 2 and "GRAFANA_TOKEN" in res.output
