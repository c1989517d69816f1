"""Every dashboard query runs on a real Prometheus scraping a real agent."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from kcops.dashboards.build import build_all
from tests.services import free_port, kcops_bin, need_binary, running, wait_http


def test_dashboard_queries_run_on_real_prometheus(tmp_path: Path) -> None:
    agent_port, prom_port = free_port(), free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: kcops\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]\n"
    )
    agent_cmd = [
        kcops_bin(),
        "agent",
        "run",
        "--listen",
        f"127.0.0.1:{agent_port}",
        "--state-dir",
        str(tmp_path / "state"),
        "--tick",
        "0.5",
    ]
    prom_cmd = [
        need_binary("prometheus"),
        f"--config.file={tmp_path / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{prom_port}",
    ]
    with (
        running(agent_cmd, log_path=tmp_path / "agent.log") as agent,
        running(prom_cmd, log_path=tmp_path / "prom.log") as prom,
    ):
        wait_http(f"http://127.0.0.1:{agent_port}/healthz", 60, agent)
        base = f"http://127.0.0.1:{prom_port}"
        wait_http(base + "/-/ready", 60, prom)
        # Wait until a few scrapes landed so rate() windows have two points.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            r = httpx.get(base + "/api/v1/query", params={"query": "count_over_time(up[1m])"})
            res = r.json()["data"]["result"]
            if res and float(res[0]["value"][1]) >= 4:
                break
            time.sleep(0.5)
        with_data = set()
        for model in build_all().values():
            for panel in model["panels"]:
                for target in panel["targets"]:
                    expr = target["expr"].replace("$instance", ".*")
                    r = httpx.get(base + "/api/v1/query", params={"query": expr}, timeout=10)
                    body = r.json()
                    assert body["status"] == "success", (panel["title"], expr, body)
                    if body["data"]["result"]:
                        with_data.add(panel["title"])
    # The agent's own panels have data even with no engine attached.
    assert {"Agent tick p99", "Agent resident memory"} <= with_data
