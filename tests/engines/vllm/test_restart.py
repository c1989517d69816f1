"""restart_worker on the supervised vLLM with a streaming request in flight: the request
completes (the engine is drained first), the new engine answers, and nothing the old
engine's process tree put in /dev/shm is left behind."""

from __future__ import annotations

import pytest

from tests.engines.vllm.harness import (
    SYSTEM_PROMPT,
    Stack,
    completion,
    shm_entries,
    stream_completion,
    wait_for,
)

pytestmark = pytest.mark.vllm


def test_restart_drains_and_cleans_shared_memory(after_soak: Stack) -> None:
    stack = after_soak
    old_shm = shm_entries() - stack.pre_shm  # what the running engine's tree created
    req = stream_completion(stack.engine_url, SYSTEM_PROMPT + "\nTell a long story.", 64)
    assert req.first_chunk.wait(120) and req.error is None, req.error
    r = stack.action("restart_worker", force=True, reason="vllm suite: restart with a request")
    rec = r.json()
    assert req.done.wait(300)
    assert req.error is None and req.finish_reason == "length", (req.error, req.chunks)
    assert rec["outcome"] == "ok", rec

    def answers() -> bool:
        if not stack.healthy():
            return False
        return bool(completion(stack.engine_url, "Hello", 4)["choices"][0]["text"])

    wait_for(answers, 300, "the new vLLM to answer", stack.log_tail)
    wait_for(
        lambda: not (old_shm & shm_entries()),
        60,
        "the old engine's /dev/shm entries to be removed",
        lambda: f"left: {sorted(old_shm & shm_entries())[:20]}",
    )
