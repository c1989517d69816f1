"""The agent's query API, and the runbook / diagnose commands that use it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from kcops.agent.samples import Sample
from kcops.cli import cli
from kcops.cli.runbook import runbook_names, runbook_queries
from tests.services import agent_in_thread


class Memory:
    """Device memory at 95% of its total: the memory alert's condition."""

    name = "memory"

    def collect(self, now: float) -> Iterable[Sample]:
        labels = {"device": "cpu"}
        return [
            Sample.of("kcops_device_memory_used_bytes", 950, labels),
            Sample.of("kcops_device_memory_total_bytes", 1000, labels),
        ]


@pytest.fixture
def agent_url(tmp_path: Path) -> Iterator[str]:
    with agent_in_thread(tmp_path, min_ticks=3, extra_collectors=[Memory()]) as url:
        yield url


def test_query_answers_in_prometheus_api_shape(agent_url: str) -> None:
    expr = "kcops_device_memory_used_bytes / kcops_device_memory_total_bytes"
    body = httpx.get(agent_url + "/api/v1/query", params={"query": expr}).json()
    assert body["status"] == "success"
    assert body["data"]["resultType"] == "vector"
    (only,) = body["data"]["result"]
    assert only["metric"] == {"device": "cpu"} and only["value"][1] == "0.95"
    scalar = httpx.get(agent_url + "/api/v1/query", params={"query": "1 + 2"}).json()
    assert scalar["data"] == {"resultType": "scalar", "result": [scalar["data"]["result"][0], "3"]}


def test_query_refuses_bad_and_unsupported_expressions(agent_url: str) -> None:
    r = httpx.get(agent_url + "/api/v1/query", params={"query": "sum("})
    assert r.status_code == 400 and r.json()["errorType"] == "bad_data"
    r = httpx.get(agent_url + "/api/v1/query", params={"query": "mad_over_time(x[5m])"})
    assert r.status_code == 400 and "mad_over_time" in r.json()["error"]
    r = httpx.get(agent_url + "/api/v1/query")
    assert r.status_code == 400 and "query" in r.json()["error"]


def test_every_alert_has_a_runbook_with_live_queries() -> None:
    import yaml

    from kcops.alerts import packaged_file

    doc = yaml.safe_load(packaged_file("rules.yaml").read_text())
    alerts = {r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r}
    assert alerts <= set(runbook_names())
    from kcops.cli.runbook import runbook_text

    assert runbook_queries(runbook_text("KcopsDeviceMemoryHigh"))


def test_runbook_walks_checks_against_the_agent(agent_url: str) -> None:
    res = CliRunner().invoke(cli, ["runbook", "KcopsDeviceMemoryHigh", "--agent", agent_url])
    assert res.exit_code == 0, res.output
    assert "# KcopsDeviceMemoryHigh" in res.output
    assert "## Live data" in res.output
    # The runbook's ratio query answered with the live value.
    live = res.output.split("## Live data", 1)[1]
    assert "0.95" in live
    assert "KcopsDeviceMemoryHigh: pending" in live or "KcopsDeviceMemoryHigh: firing" in live


def test_runbook_unknown_name_and_listing() -> None:
    res = CliRunner().invoke(cli, ["runbook", "NoSuchAlert", "--offline"])
    assert res.exit_code == 2 and "KcopsEngineDown" in res.output
    res = CliRunner().invoke(cli, ["runbook"])
    assert res.exit_code == 0 and "KcopsEngineOOM" in res.output


def test_diagnose_reports_findings(agent_url: str) -> None:
    res = CliRunner().invoke(cli, ["diagnose", "--agent", agent_url])
    assert res.exit_code == 0, res.output
    assert "findings" in res.output and "uptime" in res.output
    res = CliRunner().invoke(cli, ["diagnose", "--agent", agent_url, "--json"])
    assert res.exit_code == 0 and '"problems"' in res.output
