"""Tenants on the real vLLM (issue 31): 10,000 distinct tenant values through the served
engine keep the exported label set under its cap (50, then ``other``), and no request is
lost from the counts; a client's own marker bills no victim on any route (issue 41); the
agent's canary is billed to nobody (issue 39). After the soak: the flood would weigh on its
latency verdict."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.engines.vllm.harness import MODEL_NAME, Stack
from tests.services import wait_until

pytestmark = pytest.mark.vllm

TENANT_FLOOD = 10_000


def test_a_forged_marker_bills_no_victim_on_any_route(after_soak: Stack) -> None:
    """A client's ``kcops~victim~…`` in the Responses API's body ``request_id`` (plain and
    streamed; vLLM takes that route's id from the body) or in ``X-Request-Id`` is billed to
    the caller's tenant, never to ``victim``. Before the flood: it spends the cap."""
    stack = after_soak
    before = _queries(stack)
    url = stack.engine_url
    with httpx.Client(timeout=120) as client:
        for i, stream in enumerate((False, True)):
            body = {"model": MODEL_NAME, "input": "Hi", "max_output_tokens": 4,
                    "request_id": f"kcops~victim~{i}", "stream": stream}  # fmt: skip
            r = client.post(f"{url}/v1/responses", json=body, headers={"X-Tenant": "attacker"})
            assert r.status_code == 200, r.text[:300]
        body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1}
        headers = {"X-Tenant": "attacker", "X-Request-Id": "kcops~victim~2"}
        assert client.post(f"{url}/v1/completions", json=body, headers=headers).status_code == 200
    wait_until(lambda: _queries(stack) - before >= 3 or None, 120, "3 requests counted",
               stack.log_tail)  # fmt: skip
    m = stack.agent_metrics()
    labels = {dict(lp)["tenant"] for (n, lp) in m if n == "kcops_request_context_tokens_count"}
    assert "attacker" in labels and "victim" not in labels, sorted(labels)


def test_the_agents_canary_is_billed_to_nobody(after_soak: Stack) -> None:
    """The agent's canary (every minute while the engine works) is served and counted for
    no tenant: while it runs beside one tenant's requests, no other tenant's queries move,
    so no cost row is the canary's."""
    stack = after_soak

    def canary_runs() -> float:
        m = stack.agent_metrics()
        return sum(v for (n, lp), v in m.items() if n == "kcops_engine_canary_runs_total"
                   and dict(lp).get("outcome") == "ok")  # fmt: skip

    before, ran, sent = _by_tenant(stack), canary_runs(), 0
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 4}
    deadline = time.time() + 240
    with httpx.Client(timeout=120) as client:

        def send() -> None:
            nonlocal sent
            headers = {"X-Tenant": "canary-neighbour"}
            r = client.post(f"{stack.engine_url}/v1/completions", json=body, headers=headers)
            assert r.status_code == 200, r.text[:300]
            sent += 1

        while canary_runs() <= ran:
            assert time.time() < deadline, "the canary never ran"
            send()
        send()  # two steps after it: vLLM's worker closes a finished request at a later step
        send()
    wait_until(lambda: _by_tenant(stack).get("canary-neighbour") == sent or None, 120,
               f"the {sent} requests counted", stack.log_tail)  # fmt: skip
    after = _by_tenant(stack)
    moved = {t for t, v in after.items() if v != before.get(t, 0.0)}
    assert moved == {"canary-neighbour"}, {t: (before.get(t), after[t]) for t in moved}


def test_10000_tenants_through_vllm_keep_the_label_set_under_its_cap(after_soak: Stack) -> None:
    """10,000 requests through the served vLLM, each with a tenant of its own: the exported
    tenant labels stay at most the cap (50) plus ``other`` and ``none``; none is lost."""
    import concurrent.futures

    stack = after_soak
    before = _queries(stack)
    body = {"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    with httpx.Client(timeout=120) as client:

        def one(i: int) -> int:
            r = client.post(f"{stack.engine_url}/v1/completions", json=body,
                            headers={"X-Tenant": f"flood-{i:05d}"})  # fmt: skip
            return r.status_code

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            codes = list(pool.map(one, range(TENANT_FLOOD)))
    assert codes.count(200) == TENANT_FLOOD, {c: codes.count(c) for c in set(codes)}

    def counted() -> float | None:
        n = _queries(stack) - before
        return n if n >= TENANT_FLOOD else None

    wait_until(counted, 120, f"the {TENANT_FLOOD} requests counted", stack.log_tail)
    m = stack.agent_metrics()
    labels = {dict(lp)["tenant"] for (n, lp) in m if n == "kcops_request_context_tokens_count"}
    print(f"tenant labels after {TENANT_FLOOD} tenants: {len(labels)}")
    assert len(labels) <= 50 + 2 and "other" in labels, sorted(labels)


def _queries(stack: Stack) -> float:
    return sum(
        v for (n, lp), v in stack.agent_metrics().items()
        if n == "kcops_request_context_tokens_count" and dict(lp).get("engine") == "vllm"
    )  # fmt: skip


def _by_tenant(stack: Stack) -> dict[str, float]:
    """The vLLM requests counted so far, by tenant (what ``kcops cost`` counts as queries)."""
    out: dict[str, float] = {}
    for (n, lp), v in stack.agent_metrics().items():
        labels = dict(lp)
        if n == "kcops_request_context_tokens_count" and labels.get("engine") == "vllm":
            out[labels["tenant"]] = out.get(labels["tenant"], 0.0) + v
    return out
