"""restart_worker on the supervised vLLM with a streaming request in flight: the request is
drained, not killed (it completes with all its tokens and a finish reason); a request that
arrives while the drain holds vLLM paused completes too (the agent lets it in just before
SIGTERM, and vLLM's own drain, --shutdown-timeout, finishes it); the new engine answers;
what the old engine's tree put in /dev/shm is gone, and a segment another process made
meanwhile (unused, same user) is still there."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx
import pytest

from tests.engines.vllm.harness import (
    DRAIN_DEADLINE_S,
    POLL_S,
    RESTART_IN_FLIGHT_S,
    SHM,
    SHUTDOWN_TIMEOUT_S,
    SYSTEM_PROMPT,
    Stack,
    StreamResult,
    completion,
    shm_entries,
    stream_completion,
)
from tests.services import wait_until

pytestmark = pytest.mark.vllm

# The request in flight must still decode when the drain pauses vLLM, and finish within
# the agent's drain deadline (DRAIN_DEADLINE_S in the suite's agent config): its length
# is RESTART_IN_FLIGHT_S of this machine's decode rate, measured first (a fixed 200
# tokens ended before the pause on a faster CI machine, and once 12 s of decode did),
# within the 2,048-token context (a short prompt leaves nearly all of it).
IN_FLIGHT_S = RESTART_IN_FLIGHT_S
assert IN_FLIGHT_S < DRAIN_DEADLINE_S / 2, "the drain must outlast the request in flight"
IN_FLIGHT_TOKENS = (100, 1800)
HELD_TOKENS = 16
PROMPT = "You tell long stories to the operators of an inference service.\nTell one."


def _decode_rate(engine_url: str) -> float:
    """Tokens per second of one streaming request on this prompt (chunks after the first,
    over the time they took): what sizes the request in flight."""
    cal = stream_completion(engine_url, PROMPT, 48)
    assert cal.first_chunk.wait(120) and cal.error is None, cal.error
    t0, n0 = time.monotonic(), cal.chunks
    assert cal.done.wait(120) and cal.error is None, cal.error
    return max(1.0, (cal.chunks - n0) / max(1e-3, time.monotonic() - t0))


def _complete(req: StreamResult, tokens: int) -> None:
    assert req.done.wait(300), "the request never ended"
    assert req.error is None, req.error
    assert req.finish_reason == "length", (req.finish_reason, req.chunks)
    assert req.completion_tokens == tokens, (req.completion_tokens, req.chunks)


def _restart_lines(stack: Stack) -> list[str]:
    """The agent's own account of the restart so far (when it began, when it asked vLLM
    to stop admitting): what a failure must show."""
    keep = ("restart", "started record", "stop admitting", "/pause", "PAUSED")
    lines = stack.log_path.read_text(errors="replace").splitlines()
    return [ln[:240] for ln in lines if any(k in ln for k in keep)][-12:]


def test_restart_drains_and_cleans_shared_memory(after_soak: Stack) -> None:
    stack = after_soak
    # what the running engine's tree created: vLLM's shared memory (multiprocessing's
    # psm_* segments and sem.mp-* semaphores), not whatever else appeared on the machine
    old_shm = {n for n in shm_entries() - stack.pre_shm if n.startswith(("psm_", "sem.mp-"))}
    assert old_shm, sorted(shm_entries() - stack.pre_shm)
    bystander = SHM / f"kcops-vllm-suite-bystander-{os.getpid()}"
    bystander.write_bytes(b"\0" * 4096)  # another process's: new, unused, same user
    try:
        rate = _decode_rate(stack.engine_url)
        lo, hi = IN_FLIGHT_TOKENS
        tokens = min(hi, max(lo, round(rate * IN_FLIGHT_S)))
        req = stream_completion(stack.engine_url, PROMPT, tokens)
        assert req.first_chunk.wait(120) and req.error is None, req.error
        t_start = time.monotonic()
        answer: dict[str, httpx.Response] = {}

        def restart() -> None:
            answer["r"] = stack.action(
                "restart_worker", force=True, reason="vllm suite: restart with a request"
            )

        caller = threading.Thread(target=restart, daemon=True)
        caller.start()
        # the drain pauses vLLM (dev mode) and waits for the request in flight
        wait_until(
            lambda: stack.paused() or not caller.is_alive(),
            DRAIN_DEADLINE_S,
            "the drain's /pause",
            interval_s=POLL_S,
        )
        seen = (req.chunks, round(time.monotonic() - t_start, 1))
        assert caller.is_alive() and not req.done.is_set(), (
            "no drain seen while the request ran",
            f"{tokens} tokens at {rate:.0f} tokens/s; at the pause: chunks, seconds = {seen}",
            _restart_lines(stack),
        )
        held = stream_completion(stack.engine_url, SYSTEM_PROMPT + "\nOne more.", HELD_TOKENS)
        caller.join(600)
        assert not caller.is_alive() and "r" in answer
        rec: dict[str, Any] = answer["r"].json()
        _complete(req, tokens)
        _complete(held, HELD_TOKENS)
        assert rec["outcome"] == "ok", rec
        result = rec["result"]
        assert result["killed"] is False, result
        assert result["drain"] == {
            "how": "pause",
            "engine_drain_s": SHUTDOWN_TIMEOUT_S,
            "drained": True,
            "in_flight_left": 0,
            "resumed_before_sigterm": True,
        }, result

        def answers() -> bool:
            if not stack.healthy():
                return False
            return bool(completion(stack.engine_url, "Hello", 4)["choices"][0]["text"])

        wait_until(answers, 300, "the new vLLM to answer", stack.log_tail, interval_s=POLL_S)
        wait_until(
            lambda: not (old_shm & shm_entries()),
            60,
            "the old engine's /dev/shm entries to be removed",
            lambda: f"left: {sorted(old_shm & shm_entries())[:20]}",
            interval_s=POLL_S,
        )
        assert bystander.exists(), "a segment the engine never held was removed"
    finally:
        bystander.unlink(missing_ok=True)
