"""The adapter's canonical series equal vLLM's own values (both scraped, engine idle)."""

from __future__ import annotations

import pytest

from tests.engines.vllm.conftest import Soak
from tests.engines.vllm.harness import POLL_S, parse_metrics
from tests.services import wait_until

pytestmark = pytest.mark.vllm

# canonical name -> vLLM's names, first present wins (kept here, not imported: the test
# states what the mapping must be)
MAPS: dict[str, tuple[str, ...]] = {
    "kcops_request_latency_seconds": ("vllm:e2e_request_latency_seconds",),
    "kcops_ttft_seconds": ("vllm:time_to_first_token_seconds",),
    "kcops_inter_token_latency_seconds": (
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ),
    "kcops_kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "kcops_requests_waiting": ("vllm:num_requests_waiting",),
    "kcops_requests_running": ("vllm:num_requests_running",),
    "kcops_prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "kcops_prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
}
SUFFIXES = ("", "_total", "_bucket", "_sum", "_count")

Key = tuple[str, tuple[tuple[str, str], ...]]


def expected_from(engine: dict[Key, float]) -> dict[Key, float]:
    """vLLM's samples renamed as the agent must re-export them: canonical name, vLLM's
    ``engine`` label as ``engine_index``, plus ``engine="vllm"``."""
    out: dict[Key, float] = {}
    for canonical, sources in MAPS.items():
        for src in sources:
            found = {
                (n, lp): v for (n, lp), v in engine.items() if any(n == src + s for s in SUFFIXES)
            }
            if not found:
                continue
            for (n, lp), v in found.items():
                labels = {("engine_index" if k == "engine" else k): x for k, x in lp}
                labels["engine"] = "vllm"
                out[(canonical + n[len(src) :], tuple(sorted(labels.items())))] = v
            break
    return out


def test_canonical_series_equal_vllms_own(soak: Soak) -> None:
    stack = soak.stack
    with soak.load.paused():  # the engine idles, its values stop moving
        diff: dict[Key, tuple[float, float | None]] = {}

        def equal() -> bool:
            want = expected_from(parse_metrics(_get(stack.engine_url)))
            got = stack.agent_metrics()
            diff.clear()
            diff.update({k: (v, got.get(k)) for k, v in want.items() if got.get(k) != v})
            names = {k[0].removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
                     .removesuffix("_total") for k in want}  # fmt: skip
            return not diff and names >= set(MAPS)

        wait_until(
            equal,
            60,
            "the agent's canonical series to equal vLLM's",
            lambda: repr(diff),
            interval_s=POLL_S,
        )
    assert not diff


def _get(url: str) -> str:
    import httpx

    return httpx.get(f"{url}/metrics", timeout=5).text
