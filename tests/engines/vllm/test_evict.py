"""evict_cache on the real vLLM, through the agent: while a request runs vLLM cannot reset
its prefix cache and says so (``{"success": false}``), which is ``failed`` with that
reason; idle, it is ``ok`` with before/after read from the engine's series."""

from __future__ import annotations

import pytest

from tests.engines.vllm.harness import SYSTEM_PROMPT, Stack, stream_completion, wait_for

pytestmark = pytest.mark.vllm


def _running(stack: Stack) -> float:
    m = stack.engine_metrics()
    return sum(v for (n, _), v in m.items() if n == "vllm:num_requests_running")


def test_evict_while_a_request_runs_fails_with_vllms_reason(after_soak: Stack) -> None:
    stack = after_soak
    req = stream_completion(stack.engine_url, SYSTEM_PROMPT + "\nTell a long story.", 300)
    assert req.first_chunk.wait(120) and req.error is None, req.error
    # vLLM refreshes its gauges from the engine's stats, a step or two after the first
    # token reaches the client: wait for the gauge rather than read it once.
    wait_for(lambda: _running(stack) >= 1, 30, "vLLM's num_requests_running to count the request")
    r = stack.action("evict_cache", {"policy": "all"}, force=True, reason="vllm suite: busy")
    rec = r.json()
    assert rec["outcome"] == "failed", rec
    assert "success" in (rec.get("error") or "").lower(), rec  # vLLM's own answer, quoted
    assert req.done.wait(300) and req.error is None and req.finish_reason == "length", req


def test_evict_when_idle_is_ok_with_before_and_after(after_soak: Stack) -> None:
    stack = after_soak
    wait_for(lambda: _running(stack) == 0, 120, "vLLM to be idle")
    r = stack.action("evict_cache", {"policy": "all"}, force=True, reason="vllm suite: idle")
    rec = r.json()
    assert r.status_code == 200 and rec["outcome"] == "ok", rec
    assert rec.get("before") and rec.get("after"), rec
    audit = [a for a in stack.audit("action") if a["action"] == "evict_cache"]
    assert audit[-1]["outcome"] == "ok" and audit[-1]["before"] == rec["before"]
