"""evict_cache on the real vLLM, through the agent: while a request runs vLLM cannot reset
its prefix cache and says so (``{"success": false}``), which is ``failed`` with that
reason; idle, it is ``ok`` with before/after read from the engine's series."""

from __future__ import annotations

import pytest

from tests.engines.vllm.harness import POLL_S, SYSTEM_PROMPT, Stack, stream_completion
from tests.services import wait_until

pytestmark = pytest.mark.vllm


def _running(stack: Stack) -> float:
    m = stack.engine_metrics()
    return sum(v for (n, _), v in m.items() if n == "vllm:num_requests_running")


def test_evict_while_a_request_runs_fails_with_vllms_reason(after_soak: Stack) -> None:
    stack = after_soak
    # Long enough to be decoding through the action on any machine (the prompt is ~1,500
    # tokens of the 2,048 allowed); the test hangs up once it has seen what it needs.
    req = stream_completion(stack.engine_url, SYSTEM_PROMPT + "\nTell a long story.", 500)
    # The request holds KV blocks while it streams: that, not vLLM's running gauge (which
    # CI once read as 0 for 30 s of a streaming request), is what makes the reset fail.
    wait_until(
        lambda: req.chunks >= 3 or req.done.is_set(),
        120,
        "the request to stream",
        interval_s=POLL_S,
    )
    assert req.error is None and not req.done.is_set(), req
    running = _running(stack)  # for the failure message only
    r = stack.action("evict_cache", {"policy": "all"}, force=True, reason="vllm suite: busy")
    rec = r.json()
    seen = req.chunks
    in_flight = not req.done.is_set()
    assert in_flight, ("the request ended before the action was answered: inconclusive", req)
    assert rec["outcome"] == "failed", (rec, f"vllm:num_requests_running={running}")
    assert "success" in (rec.get("error") or "").lower(), rec  # vLLM's own answer, quoted
    # the refused reset did not disturb the request: it keeps decoding
    wait_until(
        lambda: req.chunks >= seen + 3 or req.done.is_set(), 60, "more tokens", interval_s=POLL_S
    )
    assert req.error is None and (req.chunks >= seen + 3 or req.finish_reason == "length"), req
    req.stop.set()
    assert req.done.wait(60), req


# The engine's series the agent reports before/after (agent/engine/series.py), and vLLM's
# own names for them, first present wins.
CACHE = {
    "kv_cache_usage_ratio": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total",),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total",),
    "requests_running": ("vllm:num_requests_running",),
}


def _vllms_own(stack: Stack) -> dict[str, float]:
    m = stack.engine_metrics()
    out = {}
    for name, sources in CACHE.items():
        for src in sources:
            vals = [v for (n, _), v in m.items() if n == src]
            if vals:
                out[name] = max(vals) if name.startswith("kv_") else sum(vals)
                break
    assert set(out) == set(CACHE), f"vLLM's /metrics lacks {set(CACHE) - set(out)}"
    return out


def _agent_has(stack: Stack) -> dict[str, float] | None:
    """vLLM's own values, once the agent's re-exported ones equal them (else None)."""
    own = _vllms_own(stack)
    got: dict[str, float] = {}
    for (n, lp), v in stack.agent_metrics().items():
        name = n.removeprefix("kcops_")
        if name in CACHE and dict(lp).get("engine") == "vllm":
            got[name] = max(got.get(name, v), v) if name.startswith("kv_") else got.get(name, 0) + v
    return own if got == own else None


def test_evict_when_idle_is_ok_with_before_and_after(after_soak: Stack) -> None:
    stack = after_soak
    wait_until(lambda: _running(stack) == 0, 120, "vLLM to be idle", interval_s=POLL_S)
    own_before = wait_until(
        lambda: _agent_has(stack), 60, "the agent's scrape of the idle vLLM", interval_s=POLL_S
    )
    r = stack.action("evict_cache", {"policy": "all"}, force=True, reason="vllm suite: idle")
    rec = r.json()
    assert r.status_code == 200 and rec["outcome"] == "ok", rec
    own_after = _vllms_own(stack)
    before, after = rec["before"]["engine"], rec["after"]["engine"]
    # every series is there, read from the engine: equal to vLLM's own values (idle, so
    # nothing moves between vLLM's page and the agent's scrape of it)
    assert {k: before.get(k) for k in CACHE} == own_before, (before, own_before)
    assert {k: after.get(k) for k in CACHE} == own_after, (after, own_after)
    assert after["t"] > before["t"], (before, after)  # a scrape taken after the reset
    assert own_before["prefix_cache_queries_total"] > 0  # the soak's traffic was counted
    audit = [a for a in stack.audit("action") if a["action"] == "evict_cache"]
    assert audit[-1]["outcome"] == "ok" and audit[-1]["before"] == rec["before"]
