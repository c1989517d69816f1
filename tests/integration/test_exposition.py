"""The agent's and the reference worker's ``/metrics`` are valid in both exposition formats.

A real agent scrapes a real ``kcops serve --model tiny`` that has answered a request, so both
pages hold histograms with observations. Each page is fetched as the Prometheus text format
(0.0.4) and as OpenMetrics 1.0.0, parsed by prometheus_client's parser for that format (the
OpenMetrics one refuses buckets out of order, a ``+Inf`` bucket that is not last, a count
that differs from it, or a label set split apart), and linted by ``promtool check metrics``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
from prometheus_client.parser import text_string_to_metric_families as text_families

from tests.services import free_port, kcops_bin, need_binary, running, wait_http, wait_until

pytestmark = pytest.mark.slow

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
TEXT = "text/plain; version=0.0.4"
HISTOGRAMS = {
    # A histogram of each page that has observations once the worker answered a request.
    "agent": "kcops_request_latency_seconds",
    "worker": "vllm:e2e_request_latency_seconds",
}


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("exposition")
    aport, wport = free_port(), free_port()
    agent_url, worker_url = f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{wport}"
    agent_cmd = [
        kcops_bin(),
        "agent",
        "run",
        "--listen",
        f"127.0.0.1:{aport}",
        "--state-dir",
        str(tmp / "state"),
        "--mode",
        "off",
        "--engine-url",
        worker_url,
        "--tick",
        "0.5",
    ]
    worker_cmd = [kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--threads", "1"]
    with (
        running(agent_cmd, log_path=tmp / "agent.log") as agent,
        running(worker_cmd, log_path=tmp / "worker.log") as worker,
    ):
        wait_http(agent_url + "/healthz", 30, agent)
        wait_http(worker_url + "/health", 180, worker)
        answer = httpx.post(
            worker_url + "/v1/completions",
            json={"model": "tiny", "prompt": "Once upon a time", "max_tokens": 4},
            timeout=120,
        )
        answer.raise_for_status()
        wait_until(
            lambda: observed(fetch(agent_url, TEXT)[0], HISTOGRAMS["agent"]),
            30,
            "the agent to expose the worker's request latency",
        )
        yield {"agent": agent_url, "worker": worker_url}


def fetch(url: str, accept: str) -> tuple[str, str]:
    r = httpx.get(url + "/metrics", headers={"Accept": accept}, timeout=10)
    r.raise_for_status()
    return r.text, r.headers["content-type"]


def observed(text: str, histogram: str) -> bool:
    """Whether ``histogram`` has a ``_count`` above 0 on the page."""
    return any(
        s.name == histogram + "_count" and s.value > 0
        for f in text_families(text)
        for s in f.samples
    )


def promtool_findings(text: str) -> list[str]:
    """``promtool check metrics``'s lint findings; a page it cannot parse fails here."""
    done = subprocess.run(
        [need_binary("promtool"), "check", "metrics"],
        input=text.encode(),
        capture_output=True,
        timeout=60,
    )
    out = (done.stdout + done.stderr).decode()
    # 0: clean; 3: lint findings only. 1 is a page promtool could not read.
    assert done.returncode in (0, 3), f"promtool refused the page (rc {done.returncode}): {out}"
    return [line for line in out.splitlines() if line.strip()]


# vLLM's own names, mirrored by the worker so that dashboards and rules work on either
# engine: they carry a colon, and vLLM's step histogram is named vllm:iteration_tokens_total.
VLLM_NAME_FINDINGS = (
    "metric names should not contain ':'",
    'non-counter metrics should not have "_total" suffix',
)


def vllm_colon(target: str, finding: str) -> bool:
    """promtool's note about one of vLLM's own names on the worker's page (a colon in it, or
    ``_total`` on vLLM's step histogram): the names are vLLM's, kept as vLLM writes them."""
    return (
        target == "worker" and finding.startswith("vllm:") and finding.endswith(VLLM_NAME_FINDINGS)
    )


def buckets(fam: Metric) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    return [
        (tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")), float(s.labels["le"]))
        for s in fam.samples
        if s.name.endswith("_bucket")
    ]


def assert_buckets_in_order(fam: Metric) -> None:
    """Per label set: buckets together, ``le`` strictly ascending, ``+Inf`` last."""
    seen: dict[tuple[tuple[str, str], ...], list[float]] = {}
    last_group: tuple[tuple[str, str], ...] | None = None
    for group, le in buckets(fam):
        assert group == last_group or group not in seen, f"{fam.name}: {group} split apart"
        seen.setdefault(group, []).append(le)
        last_group = group
    assert seen, f"{fam.name} has no buckets"
    for group, les in seen.items():
        assert les == sorted(set(les)) and les[-1] == float("inf"), (fam.name, group, les)


@pytest.mark.parametrize("target", ["agent", "worker"])
def test_openmetrics_page_parses_and_lints(urls: dict[str, str], target: str) -> None:
    text, ctype = fetch(urls[target], OPENMETRICS)
    assert ctype.startswith("application/openmetrics-text"), ctype
    assert text.endswith("# EOF\n")
    fams = {f.name: f for f in om_families(text)}  # raises on an invalid page
    hist = fams[HISTOGRAMS[target]]
    assert hist.type == "histogram"
    assert_buckets_in_order(hist)
    for fam in fams.values():
        # A labelled histogram with no observation yet has HELP and TYPE and no sample
        # (the worker's per-request effective context before the probe sampled a request).
        if fam.type == "histogram" and fam.samples:
            assert_buckets_in_order(fam)
    # promtool 2.42 lints the text format: it reads an OpenMetrics counter's ``_total`` (and a
    # ``_created``) as a family with no HELP of its own. Those readings are all it may report,
    # and only for families that do carry a HELP in the OpenMetrics page.
    documented = {name for name, f in fams.items() if f.documentation}
    for finding in promtool_findings(text):
        if vllm_colon(target, finding):
            continue
        series, _, problem = finding.partition(" ")
        family = series.removesuffix("_total").removesuffix("_created")
        assert problem == "no help text" and series != family and family in documented, finding


@pytest.mark.parametrize("target", ["agent", "worker"])
def test_text_page_parses_and_lints(urls: dict[str, str], target: str) -> None:
    text, ctype = fetch(urls[target], TEXT)
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    fams = {f.name: f for f in text_families(text)}
    hist = fams[HISTOGRAMS[target]]
    assert hist.type == "histogram"
    for fam in fams.values():
        # A labelled histogram with no observation yet has HELP and TYPE and no sample
        # (the worker's per-request effective context before the probe sampled a request).
        if fam.type == "histogram" and fam.samples:
            assert_buckets_in_order(fam)
    for finding in promtool_findings(text):
        assert vllm_colon(target, finding), finding
