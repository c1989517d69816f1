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
    # Long enough to be decoding through the action on any machine (the prompt is ~1,500
    # tokens of the 2,048 allowed); the test hangs up once it has seen what it needs.
    req = stream_completion(stack.engine_url, SYSTEM_PROMPT + "\nTell a long story.", 500)
    # The request holds KV blocks while it streams: that, not vLLM's running gauge (which
    # CI once read as 0 for 30 s of a streaming request), is what makes the reset fail.
    wait_for(lambda: req.chunks >= 3 or req.done.is_set(), 120, "the request to stream")
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
    wait_for(lambda: req.chunks >= seen + 3 or req.done.is_set(), 60, "more tokens")
    assert req.error is None and (req.chunks >= seen + 3 or req.finish_reason == "length"), req
    req.stop.set()
    assert req.done.wait(60), req


def test_evict_when_idle_is_ok_with_before_and_after(after_soak: Stack) -> None:
    stack = after_soak
    wait_for(lambda: _running(stack) == 0, 120, "vLLM to be idle")
    r = stack.action("evict_cache", {"policy": "all"}, force=True, reason="vllm suite: idle")
    rec = r.json()
    assert r.status_code == 200 and rec["outcome"] == "ok", rec
    assert rec.get("before") and rec.get("after"), rec
    audit = [a for a in stack.audit("action") if a["action"] == "evict_cache"]
    assert audit[-1]["outcome"] == "ok" and audit[-1]["before"] == rec["before"]
