"""A healthy vLLM under light load for five minutes from a cold start, supervised by an
agent in enforce mode (the shipped rules, the suite's config: harness.AGENT_CONFIG): no
page fires, no action runs, and the TTFT page's own expression, evaluated without its
warm-up guard over the soak's steady part, is under the shipped threshold (the guard
outlasts the soak: without this the soak could not catch a threshold that does not fit
vLLM)."""

from __future__ import annotations

import pytest

from tests.engines.vllm.conftest import Soak

pytestmark = pytest.mark.vllm

TAKEN = ("ok", "failed", "timeout")
# KcopsP99LatencyHigh's shipped threshold (p99_ttft_seconds in alerts/rules.yaml's
# defaults). The suite's agent runs with a looser one for its busy phase (TTFT_SLO_S in
# harness.py); light load must hold the shipped one.
P99_TTFT_S = 0.5


def test_healthy_vllm_is_left_alone(soak: Soak) -> None:
    v = soak.finish()
    assert v["polls"] > 100, f"the agent's alerts were read only {v['polls']} times"
    assert v["load_ok"] > 20 and not v["load_errors"], (v["load_ok"], v["load_errors"][:3])
    assert not v["pages"], f"page alerts fired: {v['pages']}"
    assert not v["page_records"], v["page_records"]
    # A refused step (a ticket's notify with no URL configured) is audited but not taken
    # (DESIGN §6): only runs that acted, or tried to, count.
    taken = [a for a in v["actions"] if a["outcome"] in TAKEN]
    assert not taken, f"actions taken: {[(a['action'], a['outcome']) for a in taken]}"
    seen = {k: x for k, x in v.items() if k.startswith(("ttft", "load"))}
    print(f"soak TTFT: {seen}")
    assert (v["ttft_requests_steady"] or 0) >= 20, v  # a p99 over real traffic
    assert v["ttft_p99_steady_s"] is not None and v["ttft_p99_steady_s"] < P99_TTFT_S, v
