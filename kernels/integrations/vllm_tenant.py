"""vLLM: the tenant of a request, from its API server to the engine core that runs it.

The tenant (a header, or OpenAI's ``user`` field) reaches only vLLM's API server process;
the engine core and its workers see a request id, tokens and sampling parameters. vLLM
takes a request's id from its ``X-Request-Id`` header (``_base_request_id``, vLLM 0.32:
``cmpl-<id>`` or ``chatcmpl-<id>``, then ``-<8 random characters>`` appended by the
engine's input processor), and that id is what the model runner's batch names
(``input_batch.req_ids``). So :class:`TenantMiddleware`, an ASGI middleware that
``vllm serve --middleware kcops.kernels.integrations.vllm_tenant.TenantMiddleware`` loads
into the API server, writes the tenant's label into that header::

    X-Request-Id: kcops~<tenant>~<the client's id, or a fresh uuid>

and the probe in the worker reads it back (:func:`tenant_of`) when the request finishes.
No side channel, no state shared between processes, nothing to join.

The label is decided in the API server by :class:`kcops.tenant.TenantLabels`, as the
reference worker decides it: the header named by ``KCOPS_TENANT_HEADER`` (default
``X-Tenant``; empty: none) first, then the JSON body's ``user``; no value is ``none``; at
most ``KCOPS_TENANT_CAP`` (50) distinct values, later new ones ``other``; anything that
could be a secret ``other``. The worker applies the same check and cap again to what it
reads (a client that forges the marker without the middleware still cannot spend the
label set or export a secret).

What the client sees: vLLM's response ``id`` carries the marker
(``cmpl-kcops~acme~<id>``); an ``X-Request-Id`` response header (``vllm serve
--enable-request-id-headers``) is put back to what the client sent. Torch-free, stdlib
only: it runs in vLLM's API server process.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from kcops.tenant import DEFAULT_CAP, DEFAULT_HEADER, TenantLabels

MARK = "kcops~"
SEP = "~"
REQUEST_ID = b"x-request-id"
MAX_BODY_BYTES = 64 << 20  # a JSON body read for its `user` field; larger: not read

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def mark(tenant: str, request_id: str) -> str:
    """``request_id`` with ``tenant``'s marker in front (a marker already there, sent by
    the client, is dropped: only the middleware names the tenant)."""
    return f"{MARK}{tenant}{SEP}{strip(request_id)}"


def strip(request_id: str) -> str:
    """``request_id`` without leading markers."""
    while request_id.startswith(MARK):
        end = request_id.find(SEP, len(MARK))
        if end < 0:
            return ""
        request_id = request_id[end + 1 :]
    return request_id


def tenant_of(request_id: str) -> str:
    """The raw tenant an engine request id carries ('' when none: no middleware)."""
    at = request_id.find(MARK)
    if at < 0:
        return ""
    start = at + len(MARK)
    end = request_id.find(SEP, start)
    return request_id[start:end] if end > start else ""


def _env_cap() -> int:
    raw = os.environ.get("KCOPS_TENANT_CAP", "").strip()
    try:
        return int(raw) if raw else DEFAULT_CAP
    except ValueError:
        raise ValueError(f"KCOPS_TENANT_CAP={raw!r}: allowed an integer 1..10000") from None


class TenantMiddleware:
    """ASGI middleware for vLLM's API server: each POST's tenant label into its request id.

    ``header`` and ``cap`` default to ``KCOPS_TENANT_HEADER`` and ``KCOPS_TENANT_CAP``; a
    bad value refuses the server's start with a message naming it."""

    def __init__(self, app: ASGIApp, header: str | None = None, cap: int | None = None) -> None:
        self.app = app
        if header is None:
            header = os.environ.get("KCOPS_TENANT_HEADER", DEFAULT_HEADER).strip()
        self.labels = TenantLabels(cap=_env_cap() if cap is None else cap, header=header or None)
        self._header = header.lower().encode() if header else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or ())
        raw = self._header_value(headers)
        replay: list[Message] = []
        if raw is None and _is_json(headers):
            replay, body = await _read_body(receive)
            raw = _user_of(body)
        tenant = self.labels.label(raw)
        sent = next((v.decode("latin-1") for k, v in headers if k == REQUEST_ID), None)
        rid = mark(tenant, sent or uuid.uuid4().hex)
        headers = [(k, v) for k, v in headers if k != REQUEST_ID]
        headers.append((REQUEST_ID, rid.encode("latin-1")))
        inner = dict(scope, headers=headers)

        async def receive_again() -> Message:
            return replay.pop(0) if replay else await receive()

        async def send_back(message: Message) -> None:
            if message.get("type") == "http.response.start":
                out = [(k, v) for k, v in message.get("headers") or () if k.lower() != REQUEST_ID]
                if sent is not None:  # the client's own id, not the marked one
                    out.append((REQUEST_ID, sent.encode("latin-1")))
                message = dict(message, headers=out)
            await send(message)

        await self.app(inner, receive_again, send_back)

    def _header_value(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        if self._header is None:
            return None
        for k, v in headers:
            if k == self._header and v.strip():
                return v.decode("latin-1")
        return None


def _is_json(headers: list[tuple[bytes, bytes]]) -> bool:
    ctype = next((v for k, v in headers if k == b"content-type"), b"")
    return ctype.split(b";")[0].strip().lower() == b"application/json"


async def _read_body(receive: Receive) -> tuple[list[Message], bytes]:
    """The request's messages (to hand on unchanged) and its body (b'' past the bound)."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            break
        size += len(message.get("body") or b"")
        if not message.get("more_body"):
            break
    if size > MAX_BODY_BYTES:
        return messages, b""
    return messages, b"".join(m.get("body") or b"" for m in messages)


def _user_of(body: bytes) -> str | None:
    """OpenAI's ``user`` field of a JSON body, if it is a string."""
    if b'"user"' not in body:
        return None
    try:
        user = json.loads(body).get("user")
    except (ValueError, AttributeError):
        return None
    return user if isinstance(user, str) else None
