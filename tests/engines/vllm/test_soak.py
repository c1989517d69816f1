"""A healthy vLLM under light load for five minutes from a cold start, supervised by an
agent in enforce mode (the shipped rules, the suite's config: harness.AGENT_CONFIG): no
page fires and no action runs.

The TTFT page's warm-up guard outlasts the soak, so the soak also evaluates the page's own
expression without it over the steady part, and holds it to what vLLM's clients saw: the
p99 the page would read must fall in the same vLLM TTFT bucket as the p99 of the load's
own time to first chunk, give or take one bucket (a page reading the wrong series, the
wrong unit or the end-to-end latency lands buckets away), and under this deployment's
objective (harness.TTFT_SLO_S), so the page stays quiet once the guard lifts.

The shipped objective (0.5 s, GPU-sized) is printed beside it, not asserted: on 2 CPU
cores one idle request of this load takes 0.36-0.57 s to its first chunk (measured
2026-12-06, the probe off or on), so the p99 of light load lands either side of 0.5 s
with the speed of the box and its other load (0.25 s on 2026-12-04; 0.497, 0.72 and
0.90 s on 2026-12-06)."""

from __future__ import annotations

import bisect
import math

import pytest

from tests.engines.vllm.conftest import Soak
from tests.engines.vllm.harness import TTFT_SLO_S

pytestmark = pytest.mark.vllm

TAKEN = ("ok", "failed", "timeout")
# KcopsP99LatencyHigh's shipped threshold (p99_ttft_seconds in alerts/rules.yaml).
SHIPPED_P99_TTFT_S = 0.5


def bucket(x: float, bounds: list[float]) -> int:
    """The index of the histogram bucket (upper bounds ``bounds``, +Inf last) holding ``x``."""
    return bisect.bisect_left(bounds, x)


def test_healthy_vllm_is_left_alone(soak: Soak) -> None:
    v = soak.finish()
    assert v["polls"] > 100, (
        f"the agent's alerts were read only {v['polls']} times; the watch's failures: "
        f"{soak.watch.failures}"
    )
    assert v["load_ok"] > 20 and not v["load_errors"], (v["load_ok"], v["load_errors"][:3])
    assert not v["pages"], f"page alerts fired: {v['pages']}"
    assert not v["page_records"], v["page_records"]
    # A refused step (a ticket's notify with no URL configured) is audited but not taken
    # (docs/architecture.md#remediation): only runs that acted, or tried to, count.
    taken = [a for a in v["actions"] if a["outcome"] in TAKEN]
    assert not taken, f"actions taken: {[(a['action'], a['outcome']) for a in taken]}"

    client, bounds = v["ttft_client_steady_s"], v["ttft_bucket_bounds"]
    page = v["ttft_p99_steady_s"]
    # A p99 over real traffic, as vLLM counted it and as the client did.
    assert (v["ttft_requests_steady"] or 0) >= 20 and len(client) >= 20, v
    assert page is not None and bounds, v
    client_p99 = client[math.ceil(0.99 * len(client)) - 1]  # nearest rank
    print(
        f"soak TTFT p99: the page's expression {page:.3f} s, the client's {client_p99:.3f} s "
        f"(median {client[len(client) // 2]:.3f} s, {len(client)} requests); objective "
        f"{TTFT_SLO_S:g} s here, shipped {SHIPPED_P99_TTFT_S:g} s "
        f"({'under' if page < SHIPPED_P99_TTFT_S else 'over'} it); loadavg {v['loadavg']}"
    )
    assert abs(bucket(page, bounds) - bucket(client_p99, bounds)) <= 1, (
        f"the TTFT page reads a p99 of {page:.3f} s where vLLM's clients saw {client_p99:.3f} s "
        f"(buckets {bounds})"
    )
    assert page < TTFT_SLO_S, v
