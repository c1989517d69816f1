"""The tenant from vLLM's API server to its engine core (issue 31, item 1): kcops' ASGI
middleware marks the request id, the worker's probe reads it back, the label set stays
bounded and never holds a secret."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from kcops.kernels import wire
from kcops.kernels.aggregate import Aggregator
from kcops.kernels.integrations import vllm_requests
from kcops.kernels.integrations.vllm_tenant import TenantMiddleware, mark, strip, tenant_of
from kcops.tenant import DEFAULT_CAP, NONE, OTHER


class App:
    """An ASGI app that records what reached it and answers with an X-Request-Id header
    (as vLLM's own middleware does with --enable-request-id-headers)."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[bytes, bytes], bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        headers = dict(scope["headers"])
        self.seen.append((headers, body))
        rid = headers.get(b"x-request-id", b"")
        hdrs = [(b"x-request-id", rid), (b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": hdrs})
        await send({"type": "http.response.body", "body": rid})


def call(
    mw: TenantMiddleware,
    *,
    headers: dict[str, str] | None = None,
    body: dict[str, Any] | None = None,
    method: str = "POST",
    chunks: int = 1,
) -> tuple[list[dict[str, Any]], dict[bytes, bytes], bytes]:
    """One request through ``mw``: (what the client got, the headers and body the app saw)."""
    raw = json.dumps(body or {"prompt": "hi"}).encode()
    hdrs = [(b"content-type", b"application/json")]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": "/v1/completions", "headers": hdrs}
    size = max(1, len(raw) // chunks + 1)
    parts = [raw[i : i + size] for i in range(0, len(raw), size)]
    messages = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
        for i, p in enumerate(parts)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(m: dict[str, Any]) -> None:
        sent.append(m)

    asyncio.run(mw(scope, receive, send))
    app = mw.app
    assert isinstance(app, App)
    seen_headers, seen_body = app.seen[-1]
    assert seen_body == raw, "the body reaches vLLM unchanged"
    return sent, seen_headers, seen_body


def test_header_first_then_user_then_none() -> None:
    mw = TenantMiddleware(App(), header="X-Tenant", cap=50)
    _, h, _ = call(mw, headers={"X-Tenant": "acme"}, body={"prompt": "x", "user": "bob"})
    assert tenant_of("cmpl-" + h[b"x-request-id"].decode() + "-1a2b3c4d") == "acme"
    _, h, _ = call(mw, body={"prompt": "x", "user": "bob"}, chunks=3)
    assert tenant_of(h[b"x-request-id"].decode()) == "bob"
    _, h, _ = call(mw)
    assert tenant_of(h[b"x-request-id"].decode()) == NONE


def test_a_secret_is_other_and_never_in_the_id() -> None:
    mw = TenantMiddleware(App(), header="X-Tenant", cap=50)
    key = "sk-proj-abcdef0123456789abcdef"
    _, h, _ = call(mw, headers={"X-Tenant": key})
    assert tenant_of(h[b"x-request-id"].decode()) == OTHER
    assert key not in h[b"x-request-id"].decode()


def test_the_clients_request_id_is_kept_and_given_back() -> None:
    mw = TenantMiddleware(App(), header="X-Tenant", cap=50)
    sent, h, _ = call(mw, headers={"X-Tenant": "acme", "X-Request-Id": "my-id-7"})
    assert h[b"x-request-id"] == b"kcops~acme~my-id-7"
    start = sent[0]
    assert dict(start["headers"])[b"x-request-id"] == b"my-id-7"
    # without one, no marked id leaks into the response headers
    sent, h, _ = call(mw, headers={"X-Tenant": "acme"})
    assert b"x-request-id" not in dict(sent[0]["headers"])


def test_a_forged_marker_is_replaced_not_trusted() -> None:
    mw = TenantMiddleware(App(), header="X-Tenant", cap=50)
    _, h, _ = call(mw, headers={"X-Request-Id": "kcops~admin~kcops~root~x"})
    rid = h[b"x-request-id"].decode()
    assert rid == "kcops~none~x" and tenant_of(rid) == NONE
    assert strip("kcops~a~kcops~b~") == "" and mark("t", "kcops~a~id") == "kcops~t~id"


def test_other_requests_pass_untouched() -> None:
    app = App()
    mw = TenantMiddleware(app, header="X-Tenant", cap=50)
    _, h, _ = call(mw, method="GET")
    assert b"x-request-id" not in h


def test_10000_tenants_keep_the_label_set_under_its_cap() -> None:
    """Through the middleware (API server) and the worker (engine core) both."""
    mw = TenantMiddleware(App(), header="X-Tenant", cap=DEFAULT_CAP)
    requests = vllm_requests.Requests()
    agg = Aggregator(topn=())
    requests.on_finish = lambda done: agg.observe_request(10, None, done.tenant)
    for i in range(10_000):
        _, h, _ = call(mw, headers={"X-Tenant": f"tenant-{i}"})
        rid = "cmpl-" + h[b"x-request-id"].decode() + "-0a1b2c3d"
        requests.finish(rid, 10)
    d = agg.take()
    assert len(d.requests) == DEFAULT_CAP + 1  # 50 tenants and other
    assert sum(h[wire.REQUEST_CONTEXT].count for h in d.requests.values()) == 10_000


def test_the_worker_checks_a_marker_again() -> None:
    """A client that forges the marker where no middleware runs cannot export a secret
    nor spend the label set past its cap."""
    requests = vllm_requests.Requests()
    assert requests.finish("cmpl-kcops~ghp_abcdefabcdefabcdefabcdef~x-1", 5).tenant == OTHER
    assert requests.finish("cmpl-plain-id-1", 5).tenant == ""
    labels = {requests.finish(f"cmpl-kcops~t{i}~x-1", 5).tenant for i in range(500)}
    assert len(labels) == DEFAULT_CAP + 1


def test_a_bad_cap_in_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOPS_TENANT_CAP", "lots")
    with pytest.raises(ValueError, match="KCOPS_TENANT_CAP='lots': allowed an integer"):
        TenantMiddleware(App())
    monkeypatch.setenv("KCOPS_TENANT_CAP", "0")
    with pytest.raises(ValueError, match="tenant cap 0"):
        TenantMiddleware(App())
