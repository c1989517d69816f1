"""A real agent scraping a real ``kcops serve``: chat requests move the canonical latency
series (request latency, TTFT, inter-token latency) exactly as completions do."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.services import free_port, kcops_bin, running, wait_http

pytestmark = pytest.mark.slow

SERIES = (
    "kcops_request_latency_seconds_count",
    "kcops_ttft_seconds_count",
    "kcops_inter_token_latency_seconds_count",
)
ROUNDS, TOKENS = 3, 5


def counts(agent_url: str) -> dict[str, float]:
    out = dict.fromkeys(SERIES, 0.0)
    text = httpx.get(agent_url + "/metrics", timeout=5).text
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in out and s.labels.get("engine") == "kcops":
                out[s.name] += s.value
    return out


def settled(agent_url: str, want_requests: float, timeout_s: float = 30.0) -> dict[str, float]:
    """The agent's counts once its request-latency count reached ``want_requests``."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = counts(agent_url)
        if now[SERIES[0]] >= want_requests:
            # The worker observes TTFT and inter-token latency before a request's end-to-end
            # latency, and the requests of a round were all answered: this snapshot is exact.
            return now
        if time.monotonic() > deadline:
            raise AssertionError(f"the agent's series did not reach {want_requests}: {now}")
        time.sleep(0.2)


def test_agent_counts_chat_exactly_as_completions(tmp_path: Path) -> None:
    aport, wport = free_port(), free_port()
    agent_url, worker_url = f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{wport}"
    # Exact counts: no synthetic request (the canary is one of the engine's own requests).
    (tmp_path / "agent.yaml").write_text("engine:\n  canary: {enabled: false}\n")
    agent_cmd = [
        kcops_bin(),
        "agent",
        "run",
        "--config",
        str(tmp_path / "agent.yaml"),
        "--listen",
        f"127.0.0.1:{aport}",
        "--state-dir",
        str(tmp_path / "state"),
        "--mode",
        "off",
        "--engine-url",
        worker_url,
        "--tick",
        "0.5",
    ]
    worker_cmd = [kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--threads", "1"]
    sdk = openai.OpenAI(base_url=worker_url + "/v1", api_key="x", max_retries=0, timeout=120)
    chat: Callable[[int], object] = lambda i: sdk.chat.completions.create(  # noqa: E731
        model="tiny",
        messages=[{"role": "user", "content": f"Tell me story number {i}."}],
        max_tokens=TOKENS,
        temperature=0,
    )
    completion: Callable[[int], object] = lambda i: sdk.completions.create(  # noqa: E731
        model="tiny", prompt=f"Story number {i}:", max_tokens=TOKENS, temperature=0
    )
    with (
        running(agent_cmd, log_path=tmp_path / "agent.log") as agent,
        running(worker_cmd, log_path=tmp_path / "worker.log") as worker,
    ):
        wait_http(agent_url + "/healthz", 30, agent)
        wait_http(worker_url + "/health", 180, worker)
        completion(-1)  # the agent has seen the worker once: its series exist
        start = settled(agent_url, 1)
        for i in range(ROUNDS):
            chat(i)
        mid = settled(agent_url, start[SERIES[0]] + ROUNDS)
        for i in range(ROUNDS):
            completion(i)
        end = settled(agent_url, mid[SERIES[0]] + ROUNDS)
    sdk.close()
    by_chat = {k: mid[k] - start[k] for k in SERIES}
    by_completion = {k: end[k] - mid[k] for k in SERIES}
    assert by_chat == by_completion
    # one request each, one first token each, TOKENS - 1 gaps between tokens each
    assert by_chat == {
        SERIES[0]: ROUNDS,
        SERIES[1]: ROUNDS,
        SERIES[2]: ROUNDS * (TOKENS - 1),
    }
