"""Cost at the probe's default sample rate against every call sampled, on the same chat-like
traffic (prompts of 150-900 tokens, answers under 10) through a real agent and a real
``kcops serve --model smollm2``: the effective/full cost ratio ``kcops cost --json``
reports is within 0.05 of the fully sampled one, and its interval holds that one. On
2026-12-07: 0.281 (0.091-0.495, 15 of 48 sampled) against 0.252; the conservative figure
0.762. The interval is wide: a request sampled at 0.003 has one or two rows of one of the 30
layers, whose K_p differ several times over (docs/kc.md)."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import httpx
import pytest

from kcops.kernels.config import ProbeConfig
from tests.integration.test_cost_tenants import agent_argv, finished
from tests.services import free_port, kcops_bin, running, wait_http, wait_until

pytestmark = pytest.mark.slow
PRICE = 0.5  # per 1,000 context tokens
REQUESTS = 48  # as the vLLM run that found the gap; ~500 tokens each: 2-20 s a prefill here
MODEL = "smollm2"  # a trained model: its effective context is far below its full one
TEXT = (
    "the cat sat on a mat and we like to read about it when time is good for you but not "
    "all day so they go out in rain with dogs who run fast over hills near old town"
)


def traffic() -> list[tuple[str, str, int]]:
    """(tenant, prompt, answer tokens) of every request: the same in both runs."""
    rng = random.Random(39)
    words = TEXT.split()
    return [
        (
            ("acme", "globex")[i % 2],
            " ".join(rng.choice(words) for _ in range(rng.randint(150, 900))),
            rng.randint(2, 9),
        )
        for i in range(REQUESTS)
    ]


def cost_at(tmp_path: Path, rate: float) -> dict[str, float]:
    """``kcops cost --json``'s totals after the traffic, the probe sampling ``rate``."""
    tmp_path.mkdir()
    aport, wport = free_port(), free_port()
    agent_url, worker_url = f"http://127.0.0.1:{aport}", f"http://127.0.0.1:{wport}"
    (tmp_path / "agent.yaml").write_text(
        f"cost:\n  prices:\n    {MODEL}: {{per_1k_context_tokens: {PRICE}}}\n"
    )
    agent_cmd = agent_argv(tmp_path, aport, worker_url)
    worker_cmd = [kcops_bin(), "serve", "--model", MODEL, "--port", str(wport), "--threads", "2"]
    env = {"KCOPS_PROBE_SAMPLE_RATE": str(rate), "KCOPS_PROBE_SOCKET": str(tmp_path / "p.sock")}
    env["KCOPS_TENANT_KEY"] = "shared-by-the-agent-and-its-engine"  # the canary bills nobody
    expected: dict[str, float] = {}
    with (
        running(agent_cmd, log_path=tmp_path / "agent.log", env=env) as agent,
        running(worker_cmd, log_path=tmp_path / "worker.log", env=env) as worker,
        httpx.Client(base_url=worker_url, timeout=300) as http,
    ):
        wait_http(agent_url + "/healthz", 30, agent)
        wait_http(worker_url + "/health", 300, worker)
        for tenant, prompt, answer in traffic():
            body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": answer, "temperature": 0}  # fmt: skip
            http.post("/v1/chat/completions", json=body, headers={"X-Tenant": tenant})
            expected[tenant] = expected.get(tenant, 0) + 1
        wait_until(
            lambda: finished(agent_url) == expected or None,
            60,
            "every request in the agent's store",
            lambda: str(finished(agent_url)),
        )
        cli = [kcops_bin(), "cost", "--agent", agent_url, "--since", "30m", "--json"]
        out = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    total: dict[str, float] = json.loads(out.stdout)["total"]
    return total


@pytest.mark.timeout(1800)  # two runs of 48 prefills: 10-25 min on 2 cores shared at load 2-6
def test_cost_at_the_default_rate_is_within_005_of_every_call_sampled(tmp_path: Path) -> None:
    every = cost_at(tmp_path / "every", 1.0)
    default = cost_at(tmp_path / "default", ProbeConfig().sample_rate)
    compare(every, default, REQUESTS)


def compare(every: dict[str, float], default: dict[str, float], n: int) -> None:
    """The acceptance: the same ``n`` requests, some unsampled at the default rate, whose
    estimated effective/full ratio is within 0.05 of the fully sampled one, inside its
    interval (shared with the vLLM test, tests/engines/vllm/test_cost_sampled.py)."""
    print("every call:", every, "\ndefault rate:", default)
    assert every["sampled"] == every["queries"] == n
    # the same traffic (greedy answers: a token more or less only if the float sums differ)
    assert default["queries"] == n
    assert default["context_tokens"] == pytest.approx(every["context_tokens"], rel=0.01)
    # some requests unsampled, or the comparison proves nothing
    assert 0 < default["sampled"] < n
    truth = every["cost_effective"] / every["cost_full"]
    ratio = default["cost_effective"] / default["cost_full"]
    low = default["cost_effective_low"] / default["cost_full"]
    high = default["cost_effective_high"] / default["cost_full"]
    conservative = default["cost_conservative"] / default["cost_full"]
    print(f"truth {truth:.3f}, estimate {ratio:.3f} ({low:.3f}-{high:.3f}), conservative "
          f"{conservative:.3f}; {default['sampled']:g} of {n} sampled")  # fmt: skip
    assert abs(ratio - truth) <= 0.05
    assert low <= truth <= high
