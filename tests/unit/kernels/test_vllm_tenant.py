"""The tenant from vLLM's API server to its engine core (issue 31, item 1; issue 41): kcops'
ASGI middleware marks the request id with a keyed digest, the worker's probe reads it back,
the label set stays bounded and never holds a secret."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from kcops.kernels import wire
from kcops.kernels.aggregate import Aggregator
from kcops.kernels.integrations import vllm_requests
from kcops.kernels.integrations.vllm_tenant import TenantMiddleware, mark, tenant_key, tenant_of
from kcops.tenant import DEFAULT_CAP, KEY_ENV, NONE, OTHER, canary_id

KEY = b"test-key"


async def read_body(receive: Any) -> bytes:
    """An ASGI request's whole body."""
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            return body


class App:
    """An ASGI app that records what reached it and answers with an X-Request-Id header
    (as vLLM's own middleware does with --enable-request-id-headers)."""

    def __init__(self) -> None:
        self.seen: list[tuple[dict[bytes, bytes], bytes]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await read_body(receive)
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
    path: str = "/v1/completions",
) -> tuple[list[dict[str, Any]], dict[bytes, bytes], bytes]:
    """One request through ``mw``: (what the client got, the headers and body the app saw)."""
    raw = json.dumps(body or {"prompt": "hi"}).encode()
    hdrs = [(b"content-type", b"application/json")]
    hdrs += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": method, "path": path, "headers": hdrs}
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
    if b'"request_id"' not in raw and not path.endswith("/responses"):
        assert seen_body == raw, "the body reaches vLLM unchanged"
    return sent, seen_headers, seen_body


def middleware() -> TenantMiddleware:
    return TenantMiddleware(App(), header="X-Tenant", key=KEY)


def test_header_first_then_user_then_none() -> None:
    mw = middleware()
    _, h, _ = call(mw, headers={"X-Tenant": "acme"}, body={"prompt": "x", "user": "bob"})
    assert tenant_of("cmpl-" + h[b"x-request-id"].decode() + "-1a2b3c4d", KEY) == "acme"
    _, h, _ = call(mw, body={"prompt": "x", "user": "bob"}, chunks=3)
    assert tenant_of(h[b"x-request-id"].decode(), KEY) == "bob"
    _, h, _ = call(mw)
    assert tenant_of(h[b"x-request-id"].decode(), KEY) == NONE


def test_a_secret_is_other_and_never_in_the_id() -> None:
    mw = middleware()
    key = "sk-proj-abcdef0123456789abcdef"
    _, h, _ = call(mw, headers={"X-Tenant": key})
    assert tenant_of(h[b"x-request-id"].decode(), KEY) == OTHER
    assert key not in h[b"x-request-id"].decode()


def test_the_clients_request_id_is_kept_and_given_back() -> None:
    mw = middleware()
    sent, h, _ = call(mw, headers={"X-Tenant": "acme", "X-Request-Id": "my-id-7"})
    assert h[b"x-request-id"] == mark(KEY, "acme", "my-id-7").encode()
    assert h[b"x-request-id"].startswith(b"kcops~acme~my-id-7~")
    start = sent[0]
    assert dict(start["headers"])[b"x-request-id"] == b"my-id-7"
    # without one, vLLM's echo is the id made for it, unmarked (no marker leaks out)
    sent, h, _ = call(mw, headers={"X-Tenant": "acme"})
    given = dict(sent[0]["headers"])[b"x-request-id"]
    assert given and b"kcops~" not in given
    assert h[b"x-request-id"] == mark(KEY, "acme", given.decode()).encode()


def test_a_forged_marker_is_replaced_not_trusted() -> None:
    mw = middleware()
    _, h, _ = call(mw, headers={"X-Request-Id": "kcops~admin~kcops~root~x"})
    rid = h[b"x-request-id"].decode()
    assert rid == mark(KEY, "none", "kcops-admin-kcops-root-x") and tenant_of(rid, KEY) == NONE
    assert tenant_of("kcops~admin~kcops~root~x", KEY) == ""  # as the client sent it


def test_the_body_id_of_the_responses_api_is_marked_too() -> None:
    """vLLM's Responses API takes the engine's id from the body, and a body id elsewhere
    is marked too (the header wins there)."""
    for path, body, own in [
        ("/v1/responses", {"input": "x", "request_id": "kcops~victim~1"}, "kcops-victim-1"),
        ("/v1/chat/completions", {"messages": [], "request_id": "r2"}, "r2"),
    ]:
        _, h, seen = call(middleware(), headers={"X-Tenant": "acme"}, body=body, path=path)
        assert json.loads(seen)["request_id"] == mark(KEY, "acme", own)
        assert h[b"content-length"] == str(len(seen)).encode()
    _, h, seen = call(middleware(), body={"input": "x", "user": "bob"}, path="/v1/responses")
    rid = json.loads(seen)["request_id"]
    assert tenant_of(rid, KEY) == "bob" == tenant_of(h[b"x-request-id"].decode(), KEY)


def test_other_requests_pass_untouched() -> None:
    app = App()
    mw = TenantMiddleware(app, header="X-Tenant", key=KEY)
    _, h, _ = call(mw, method="GET")
    assert b"x-request-id" not in h


def test_10000_tenants_keep_the_label_set_under_its_cap() -> None:
    """Through the middleware (API server) and the worker (engine core) both: the worker,
    which sees only requests that ran, applies the cap."""
    mw = middleware()
    requests = vllm_requests.Requests(key=KEY)
    agg = Aggregator(topn=())
    requests.on_finish = lambda done: agg.observe_request(10, None, done.tenant)
    for i in range(10_000):
        _, h, _ = call(mw, headers={"X-Tenant": f"tenant-{i}"})
        rid = "cmpl-" + h[b"x-request-id"].decode() + "-0a1b2c3d"
        requests.finish(rid, 10)
    d = agg.take()
    assert len(d.requests) == DEFAULT_CAP + 1  # 50 tenants and other
    assert sum(h[wire.REQUEST_CONTEXT].count for h in d.requests.values()) == 10_000


def test_the_worker_trusts_only_markers_of_its_key() -> None:
    requests = vllm_requests.Requests(key=KEY)
    secret = "cmpl-" + mark(KEY, "ghp_abcdefabcdefabcdefabcdef", "x") + "-1"
    assert requests.finish(secret, 5).tenant == OTHER  # checked again all the same
    assert requests.finish("cmpl-plain-id-1", 5).tenant == ""
    assert requests.finish("cmpl-" + mark(b"other-key", "acme", "x") + "-1", 5).tenant == ""
    assert requests.finish("cmpl-" + mark(KEY, "acme", "x")[:-1] + "-1", 5).tenant == ""
    labels = {requests.finish(mark(KEY, f"t{i}", "x") + "-1", 5).tenant for i in range(500)}
    assert len(labels) == DEFAULT_CAP + 1


def test_the_agents_canary_is_served_and_billed_to_nobody() -> None:
    """The canary's signed id survives the middleware's marker; the worker closes it and
    reports it to no tenant. An id that borrows its form without the key's signature is a
    client's, billed as any other."""
    mw, requests = middleware(), vllm_requests.Requests(key=KEY)
    done: list[vllm_requests.Finished] = []
    requests.on_finish = done.append
    own = canary_id(KEY)
    forged = own[:-1] + ("1" if own.endswith("0") else "0")
    for rid in (own, forged, canary_id(b"another-key")):
        sent, h, _ = call(mw, headers={"X-Request-Id": rid})
        assert sent[0]["status"] == 200  # served
        engine_id = "cmpl-" + h[b"x-request-id"].decode() + "-0a1b2c3d"
        requests.owners([engine_id])
        requests.finish(engine_id, 10)
    assert [d.tenant for d in done] == [NONE, NONE] and not requests.open
    assert done[0].request_id.find(forged) > 0


def test_the_key_is_the_environments_or_made_once_for_the_processes_to_come(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(KEY_ENV, "from-the-agent")
    assert tenant_key() == b"from-the-agent" and TenantMiddleware(App()).key == b"from-the-agent"
    monkeypatch.delenv(KEY_ENV)
    made = tenant_key()
    assert len(made) == 64 and os.environ[KEY_ENV] == made.decode() and tenant_key() == made


def test_a_bad_header_name_in_the_environment_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KCOPS_TENANT_HEADER", "X Tenant")
    with pytest.raises(ValueError, match="'X Tenant' is not a header name"):
        TenantMiddleware(App(), key=KEY)
