"""Fleet answers from a real Prometheus: two pods (each a real agent supervising a real
``kcops serve --model tiny``), scraped by one Prometheus that also evaluates the shipped
recording rules (alerts/records.yaml). Tenants are spread over both pods.

- ``kcops cost --prometheus`` sums the pods: its rows equal the sum of each agent's own
  ``kcops cost --agent`` rows, and ``--selector`` narrows it to one pod's;
- ``kcops kc recommend --prometheus`` sums the pods' K(C) histograms by layer: each layer's
  samples equal the two agents' own counts added, both pods are named, and each pod's own N
  equals what its agent recommends from its store (one implementation, two sources);
- the recording rules have data for the fleet's cost and K(C).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.services import free_port, kcops_bin, need_binary, running, wait_http, wait_until

pytestmark = pytest.mark.slow
PRICE = 0.5
MIN_SAMPLES = 5
# tenant -> requests sent to pod 0 and to pod 1
LOAD = {"acme": (2, 2), "globex": (3, 0), "initech": (0, 2)}


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    body = httpx.get(url + "/api/v1/query", params={"query": expr}, timeout=10).json()
    assert body["status"] == "success", (expr, body)
    return list(body["data"]["result"])


def _by(url: str, expr: str, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in _query(url, expr)}


TOKEN = "fleet-token"


def _cli(*args: str) -> dict[str, Any]:
    env = {**os.environ, "KCOPS_TOKEN": TOKEN}
    out = subprocess.run(
        [kcops_bin(), *args, "--json"], capture_output=True, text=True, timeout=90, env=env
    )
    assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-2000:])
    return dict(json.loads(out.stdout))


class Pod:
    def __init__(self, stack: ExitStack, tmp: Path, i: int) -> None:
        d = tmp / f"pod{i}"
        d.mkdir()
        self.port, wport = free_port(), free_port()
        self.url, self.worker = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{wport}"
        (d / "agent.yaml").write_text(
            "engine:\n  canary: {enabled: false}\n"
            f"cost:\n  prices:\n    tiny: {{per_1k_context_tokens: {PRICE}}}\n"
            f"recommendation: {{min_samples: {MIN_SAMPLES}}}\n"
        )
        agent = [
            kcops_bin(), "agent", "run", "--config", str(d / "agent.yaml"),
            "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(d / "state"),
            "--mode", "off", "--engine-url", self.worker, "--tick", "0.5",
        ]  # fmt: skip
        worker = [kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--threads", "1"]
        env = {  # every call sampled, K(C) of every layer: each request gives samples
            "KCOPS_PROBE_SAMPLE_RATE": "1.0",
            "KCOPS_PROBE_KC_LAYERS_MS": "200",
            "KCOPS_PROBE_FLUSH_MS": "100",
            "KCOPS_PROBE_SOCKET": str(d / "probe.sock"),
            "KCOPS_TOKEN": TOKEN,  # kc recommend --refresh needs it
        }
        self.agent_proc = stack.enter_context(running(agent, log_path=d / "agent.log", env=env))
        self.worker_proc = stack.enter_context(running(worker, log_path=d / "worker.log", env=env))
        self.sdk = openai.OpenAI(
            base_url=self.worker + "/v1", api_key="x", max_retries=0, timeout=120
        )
        stack.callback(self.sdk.close)

    def send(self, tenant: str, n: int) -> None:
        for i in range(n):
            self.sdk.completions.create(
                model="tiny",
                prompt=f"{tenant} asks question {i}: " + "tell me more. " * (10 + 5 * i),
                max_tokens=4,
                temperature=0,
                extra_headers={"X-Tenant": tenant},
            )


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[Pod], str]]:
    with ExitStack() as stack:
        pods = [Pod(stack, tmp_path, i) for i in range(2)]
        prom_port = free_port()
        records = Path(__file__).resolve().parents[2] / "alerts" / "records.yaml"
        (tmp_path / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: ['{tmp_path / 'records.yaml'}']\n"
            "scrape_configs:\n"
            "  - job_name: kcops\n"
            f"    static_configs: [{{targets: {[f'127.0.0.1:{p.port}' for p in pods]}}}]\n"
        )
        # the shipped recording rules as Prometheus loads them (kcops alerts export --records)
        exported = subprocess.run(
            [kcops_bin(), "alerts", "export", "--records"], capture_output=True, text=True
        )
        assert exported.returncode == 0, exported.stderr
        (tmp_path / "records.yaml").write_text(exported.stdout)
        assert records.exists()
        prom_cmd = [
            need_binary("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ]
        prom = stack.enter_context(running(prom_cmd, log_path=tmp_path / "prom.log"))
        for p in pods:
            wait_http(p.url + "/healthz", 60, p.agent_proc)
            wait_http(p.worker + "/health", 180, p.worker_proc)
        base = f"http://127.0.0.1:{prom_port}"
        wait_http(base + "/-/ready", 60, prom)
        yield pods, base


def test_fleet_cost_and_recommendation_equal_the_pods_added(
    fleet: tuple[list[Pod], str],
) -> None:
    pods, prom = fleet
    for tenant, per_pod in LOAD.items():
        for pod, n in zip(pods, per_pod, strict=True):
            pod.send(tenant, n)
    queries = "kcops_request_context_tokens_count"
    want = [{t: float(n[i]) for t, n in LOAD.items() if n[i]} for i in range(2)]
    for i, pod in enumerate(pods):  # every request in its agent's store
        wait_until(
            lambda pod=pod, i=i: (
                _by(pod.url, f"sum by (tenant) ({queries})", "tenant") == want[i] or None
            ),
            60,
            f"pod {i}'s requests in its agent",
        )
    total = {t: float(sum(n)) for t, n in LOAD.items()}
    wait_until(  # ... and in Prometheus: a scrape later
        lambda: _by(prom, f"sum by (tenant) ({queries})", "tenant") == total or None,
        30,
        "every request scraped by Prometheus",
    )
    own = [_cli("cost", "--agent", p.url, "--since", "10m") for p in pods]
    fleet_cost = _cli("cost", "--prometheus", prom, "--since", "10m")
    one = _cli(
        "cost",
        "--prometheus",
        prom,
        "--since",
        "10m",
        "--selector",
        f'instance="127.0.0.1:{pods[0].port}"',
    )

    def rows(doc: dict[str, Any]) -> dict[str, dict[str, float]]:
        return {r["tenant"]: r for r in doc["rows"]}

    summed: dict[str, dict[str, float]] = {}
    for doc in own:
        for t, r in rows(doc).items():
            acc = summed.setdefault(t, {})
            for k in (
                "queries",
                "context_tokens",
                "effective_tokens",
                "cost_full",
                "cost_effective",
            ):
                acc[k] = acc.get(k, 0.0) + r[k]
    got = rows(fleet_cost)
    assert set(got) == set(LOAD), got
    for t, acc in summed.items():
        for k, v in acc.items():
            assert got[t][k] == pytest.approx(v), (t, k, got[t][k], v)
    assert fleet_cost["total"]["queries"] == sum(total.values())
    assert fleet_cost["source"]["kind"] == "prometheus"
    assert {t: r["queries"] for t, r in rows(one).items()} == want[0]

    # The fleet's K(C): the pods' histograms summed by layer, through the agent's own code.
    layer_counts = [_by(p.url, "sum by (layer) (kcops_kc_tokens_count)", "layer") for p in pods]
    assert all(len(c) >= 2 for c in layer_counts), layer_counts  # every layer of each pod
    wait_until(
        lambda: (
            _by(prom, "sum by (layer) (kcops_kc_tokens_count)", "layer")
            == {
                k: layer_counts[0].get(k, 0) + layer_counts[1].get(k, 0)
                for k in {*layer_counts[0], *layer_counts[1]}
            }
            or None
        ),
        30,
        "the pods' K(C) scraped by Prometheus",
    )
    doc = _cli(
        "kc", "recommend", "--prometheus", prom, "--since", "10m",
        "--config", str(_pod_config(pods[0])),
    )["fleet"]  # fmt: skip
    (model,) = doc["models"]
    assert model["model"] == "tiny" and model["status"] == "ok", model
    assert {r["pod"] for r in model["pods"]} == {f"127.0.0.1:{p.port}" for p in pods}
    for row in model["layers"]:
        added = sum(c.get(row["layer"], 0.0) for c in layer_counts)
        assert row["samples"] == round(added), (row, layer_counts)
    by_pod = {r["pod"]: r for r in model["pods"]}
    for p in pods:
        row = by_pod[f"127.0.0.1:{p.port}"]
        live = _cli("kc", "recommend", "--agent", p.url, "--refresh")["live"]
        assert live["status"] == "ok", live
        assert row["n"] == live["uniform"]["tokens"], (row, live["uniform"])
    assert doc["window"]["covered_s"] > 0
    text = subprocess.run(
        [kcops_bin(), "kc", "recommend", "--prometheus", prom, "--since", "10m",
         "--config", str(_pod_config(pods[0]))],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    print(text.stdout)
    assert text.returncode == 0, text.stderr
    first = text.stdout.splitlines()[0]
    assert first.startswith("window: covers ") and "of the 10m asked" in first, first
    assert all(f"127.0.0.1:{p.port}" in text.stdout for p in pods)
    # The report page from the same Prometheus: its window, and the fleet's cost table.
    page = _pod_config(pods[0]).parent / "fleet.html"
    made = subprocess.run(
        [kcops_bin(), "report", "--prometheus", prom, "--since", "10m", "--out", str(page)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert made.returncode == 0, (made.stdout, made.stderr)
    html = page.read_text()
    assert "window: covers " in html and f"the Prometheus at {prom}" in html
    assert all(t in html for t in LOAD) and "Cost by effective context" in html
    # The recording rules: the fleet's cost and K(C) per model, tenant and layer.
    wait_until(
        lambda: _query(prom, "sum(model_tenant:kcops_requests:rate5m)") or None,
        30,
        "the recording rules evaluated",
    )
    by_tenant = _by(prom, "model_tenant:kcops_cost_full:rate5m", "tenant")
    assert set(by_tenant) == set(LOAD), by_tenant
    assert _query(prom, "engine_layer:kcops_kc_tokens:p95_5m")
    # ... and the fleet dashboard, which reads them, has data in every panel
    from kcops.dashboards.build import build_all

    for panel in build_all()["kcops-fleet.json"]["panels"]:  # type: ignore[union-attr]
        for target in panel["targets"]:
            assert _query(prom, target["expr"]), (panel["title"], target["expr"])


def _pod_config(pod: Pod) -> Path:
    return Path(pod.agent_proc.args[pod.agent_proc.args.index("--config") + 1])
