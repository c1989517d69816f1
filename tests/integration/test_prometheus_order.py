"""Result order, judged by the real Prometheus 2.42 server: topk, bottomk, sort, sort_desc.

``promtool test rules`` compares results as sets, and its loader creates
series in Go-map order, so it cannot judge order or which of several equal
values topk keeps. A Prometheus server over a block written by ``promtool
tsdb create-blocks-from openmetrics`` can: a block holds series in label
order, as kcops's store hands them out, so given the same input order both
must give the same answer, element for element. Seeded tie-heavy data (and
NaN) over groups of 1 to 130 series exercise Go's heap and every path of its
pdqsort.
"""

from __future__ import annotations

import math
import random
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from kcops.agent.promql.evaluator import Evaluator
from kcops.agent.promql.parse import parse_expr
from kcops.agent.query import to_api
from kcops.agent.rules.promtest import series_key
from kcops.agent.store import Store
from tests.services import free_port, need_binary, running, wait_http

pytestmark = pytest.mark.slow

SEED = 17
METRICS = 30
STEPS = 10
SIZES = (1, 2, 3, 5, 8, 12, 13, 20, 40, 49, 51, 80, 130)
TIES = (0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, math.nan)


def _series(rng: random.Random) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {}
    for m in range(METRICS):
        n = rng.choice(SIZES)
        pool = TIES if rng.random() < 0.7 else (*(float(v) for v in range(n)), math.nan)
        rows = []
        for i in range(n):
            job = rng.choice("abc")
            rows.append((f'{{job="{job}",inst="i{i}"}}', rng.choice(pool)))
        out[f"m{m}"] = rows
    return out


def _queries(rng: random.Random, series: dict[str, list[tuple[str, float]]]) -> list[str]:
    qs = []
    for name, rows in series.items():
        k = rng.randint(1, len(rows) + 1)
        qs += [
            f"topk({k}, {name})",
            f"bottomk({k}, {name})",
            f"topk by (job) ({rng.randint(1, 20)}, {name})",
            f"bottomk by (job) ({rng.randint(1, 20)}, {name})",
            f"sort({name})",
            f"sort_desc({name})",
            f"sort_desc(topk({k}, {name}) > 0)",
            f"sort({name} * 2)",
            f"sum by (job) ({name})",
            f"{name} > 1",
        ]
    return qs


def _openmetrics(series: dict[str, list[tuple[str, float]]], t0: int) -> str:
    lines = []
    for name, rows in series.items():
        lines.append(f"# TYPE {name} gauge")
        for step in range(STEPS):
            for labels, v in rows:
                lines.append(f"{name}{labels} {'NaN' if math.isnan(v) else v} {t0 + 60 * step}")
    return "\n".join([*lines, "# EOF", ""])


@pytest.fixture(scope="module")
def prometheus(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Store, float, list[str]]]:
    tmp = tmp_path_factory.mktemp("prom")
    rng = random.Random(SEED)
    series = _series(rng)
    t0 = (int(time.time()) // 3600 - 3) * 3600  # inside the default retention
    (tmp / "data.om").write_text(_openmetrics(series, t0))
    subprocess.run(
        [need_binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", "data.om", "tsdb"],
        check=True,
        capture_output=True,
        cwd=tmp,
    )
    (tmp / "prometheus.yml").write_text("global:\n  scrape_interval: 1h\n")
    port = free_port()
    store = Store(retention_s=1e12)
    for name, rows in series.items():
        for labels, v in rows:
            for step in range(STEPS):
                store.append(series_key(name + labels), float(t0 + 60 * step), v)
    cmd = [
        need_binary("prometheus"),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with running(cmd, log_path=tmp / "prometheus.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/-/ready", proc=proc)
        yield url, store, float(t0 + 60 * (STEPS - 1)), _queries(rng, series)


def _kcops(store: Store, query: str, t: float) -> list[tuple[dict[str, str], str]]:
    data = to_api(Evaluator(store).run(parse_expr(query), t), t)
    return [(e["metric"], e["value"][1]) for e in data["result"]]


def test_ordered_results_equal_prometheus_element_for_element(
    prometheus: tuple[str, Store, float, list[str]],
) -> None:
    url, store, t, queries = prometheus
    differ = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for q in queries:
            body = client.get("/api/v1/query", params={"query": q, "time": t}).json()
            assert body["status"] == "success", (q, body)
            want = [(e["metric"], e["value"][1]) for e in body["data"]["result"]]
            if _kcops(store, q, t) != want:
                differ.append(q)
    assert len(queries) == METRICS * 10
    assert not differ, f"{len(differ)} of {len(queries)} differ, e.g. {differ[:5]}"
