"""The tenant channel of vLLM cannot be forged (issue 41, items 1 and 2): kcops' real ASGI
middleware in front of a small API server that takes the engine's request id where vLLM
0.32 takes it (``/v1/responses``: the body's ``request_id``; completions: ``X-Request-Id``)
and whose worker bills what the real ``vllm_requests`` reads back from that id."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest

from kcops.kernels.integrations import vllm_requests
from kcops.kernels.integrations.vllm_tenant import TenantMiddleware
from tests.unit.kernels.test_vllm_tenant import read_body

MODEL = "m"
RESERVED = {"unknown", "none", "other"}


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine's processes inherit: one key for the API server and the worker."""
    monkeypatch.setenv("KCOPS_TENANT_KEY", "the-engines-key")


class ApiServer:
    """vLLM's API server as far as the request id goes: a request for the served model
    runs (its worker finishes it and bills its tenant); ``/tokenize`` and an unknown model
    run nothing."""

    def __init__(self) -> None:
        self.worker = vllm_requests.Requests()
        self.billed: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = await read_body(receive)
        req = json.loads(body)
        header = dict(scope["headers"]).get(b"x-request-id", b"").decode()
        if scope["path"] == "/v1/responses":  # the body's id, never the header's
            rid = req.get("request_id") or f"resp_{uuid.uuid4().hex}"
        else:
            rid = "cmpl-" + (header or req.get("request_id") or uuid.uuid4().hex) + "-0"
        if scope["path"] != "/tokenize" and req.get("model") == MODEL:
            # the engine's input processor appends 8 random characters
            done = self.worker.finish(f"{rid}-{uuid.uuid4().hex[:8]}", 10)
            self.billed.append(done.tenant)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        chunks = [b"data: 1\n\n", b"data: [DONE]\n\n"] if req.get("stream") else [b"{}"]
        for i, chunk in enumerate(chunks):
            more = i < len(chunks) - 1
            await send({"type": "http.response.body", "body": chunk, "more_body": more})


def post(mw: TenantMiddleware, path: str, body: dict[str, Any], **headers: str) -> None:
    raw = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
    hdrs += [(k.replace("_", "-").lower().encode(), v.encode()) for k, v in headers.items()]
    scope = {"type": "http", "method": "POST", "path": path, "headers": hdrs}
    messages = [{"type": "http.request", "body": raw, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(m: dict[str, Any]) -> None:
        pass

    asyncio.run(mw(scope, receive, send))


def served() -> tuple[TenantMiddleware, ApiServer]:
    app = ApiServer()
    return TenantMiddleware(app), app


@pytest.mark.parametrize("stream", [False, True])
def test_a_marker_in_the_responses_body_bills_no_victim(stream: bool) -> None:
    mw, app = served()
    body = {"model": MODEL, "input": "hi", "request_id": "kcops~victim~1", "stream": stream}
    post(mw, "/v1/responses", body, x_tenant="attacker")
    post(mw, "/v1/responses", {"model": MODEL, "input": "hi", "stream": stream}, x_tenant="acme")
    assert app.billed == ["attacker", "acme"]


def test_a_marker_kcops_did_not_write_names_no_tenant() -> None:
    """Ids that reach the engine without the middleware (another route, a server without
    it): a marker there is no tenant's."""
    worker = vllm_requests.Requests()
    for rid in ("cmpl-kcops~victim~1-0-1a2b3c4d", "kcops~victim~1", "resp_x-kcops~victim~"):
        assert worker.finish(rid, 10).tenant == ""


def test_a_marker_in_a_header_or_a_chat_body_bills_the_caller() -> None:
    mw, app = served()
    chat = {"model": MODEL, "messages": [], "request_id": "kcops~victim~2"}
    post(mw, "/v1/chat/completions", chat, x_tenant="attacker")
    post(
        mw, "/v1/completions", {"model": MODEL}, x_tenant="attacker", x_request_id="kcops~victim~3"
    )
    post(mw, "/v1/completions", {"model": MODEL, "user": "bob"}, x_request_id="kcops~victim~4")
    assert app.billed == ["attacker", "attacker", "bob"]


def test_requests_that_never_run_spend_no_tenant_slot() -> None:
    mw, app = served()
    for i in range(50):
        post(mw, "/tokenize", {"model": MODEL, "prompt": "x"}, x_tenant=f"probe-{i}")
        post(mw, "/v1/completions", {"model": "no-such-model"}, x_tenant=f"guess-{i}")
    post(mw, "/v1/completions", {"model": MODEL}, x_tenant="real-tenant")
    post(mw, "/v1/responses", {"model": MODEL, "input": "x"}, x_tenant="second-tenant")
    assert app.billed == ["real-tenant", "second-tenant"]


@pytest.mark.parametrize("name", ["unknown", "none", "other", "Other", "NONE", "uNkNoWn"])
def test_a_client_cannot_call_itself_a_reserved_label(name: str) -> None:
    mw, app = served()
    post(mw, "/v1/completions", {"model": MODEL}, x_tenant=name)
    post(mw, "/v1/completions", {"model": MODEL, "user": name})
    assert len(app.billed) == 2
    assert not {t.lower() for t in app.billed} & RESERVED, app.billed
