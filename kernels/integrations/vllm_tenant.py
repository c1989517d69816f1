"""vLLM: the tenant of a request, from its API server to the engine core that runs it.

The tenant (a header, or OpenAI's ``user`` field) reaches only vLLM's API server process;
the engine core and its workers see a request id, tokens and sampling parameters. vLLM
0.32 takes a request's id from its ``X-Request-Id`` header (``cmpl-<id>``,
``chatcmpl-<id>``), or, for the Responses API, from the JSON body's ``request_id``, then
appends ``-<8 random characters>``; that id is what the model runner's batch names
(``input_batch.req_ids``). So :class:`TenantMiddleware`, an ASGI middleware that
``vllm serve --middleware kcops.kernels.integrations.vllm_tenant.TenantMiddleware`` loads
into the API server, writes the tenant's label into both places::

    kcops~<tenant>~<the client's id, or a fresh uuid, "~" made "-">~<digest>

(the body's ``request_id`` where the body has one or the route is ``…/responses``), and
the probe in the worker reads it back (:func:`tenant_of`) when the request finishes. The
digest is HMAC-SHA256 of the tenant and the id's own part, 16 hex characters, keyed by
``KCOPS_TENANT_KEY`` (:func:`tenant_key`), so a marker kcops did not write (a client's, in
the header or the body) names no tenant: its requests are ``unknown``.

The label is decided here by :func:`kcops.tenant.clean`, as the reference worker decides
it: the header named by ``KCOPS_TENANT_HEADER`` (default ``X-Tenant``; empty: none) first,
then the JSON body's ``user``; no value is ``none``; anything that could be a secret
``other``. The cap (50 labels) applies where only requests that ran are seen: the worker
and the agent, so requests that never run (``/tokenize``, an unknown model) spend none.

What the client sees: vLLM's response ``id`` carries the marker
(``cmpl-kcops~acme~<id>~<digest>``); an ``X-Request-Id`` response header (``vllm serve
--enable-request-id-headers``) is what the client sent, or the id made for it, unmarked.
Torch-free, stdlib only: it runs in vLLM's API server process.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from kcops.tenant import DEFAULT_HEADER, check_header_name, clean, tenant_key

MARK = "kcops~"
SEP = "~"
DIGEST_CHARS = 16  # of the HMAC-SHA256's hex: 64 bits
REQUEST_ID = b"x-request-id"
BODY_ID = "request_id"  # where the Responses API takes the engine's request id from
MAX_BODY_BYTES = 64 << 20  # a JSON body read for its `user` and `request_id`; larger: not read

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _digest(key: bytes, tenant: str, own: str) -> str:
    msg = f"{tenant}{SEP}{own}".encode()
    return hmac.new(key, msg, hashlib.sha256).hexdigest()[:DIGEST_CHARS]


def mark(key: bytes, tenant: str, request_id: str) -> str:
    """``request_id`` marked with ``tenant`` (its ``~`` made ``-``: a marker sent by the
    client is no marker)."""
    own = request_id.replace(SEP, "-")
    return f"{MARK}{tenant}{SEP}{own}{SEP}{_digest(key, tenant, own)}"


def tenant_of(request_id: str, key: bytes) -> str:
    """The tenant an engine request id was marked with ('' when none, or when its digest
    does not check: a marker kcops did not write). vLLM adds to the marked id on both
    sides (``cmpl-``, ``-0``, ``-<random>``), never a ``~``."""
    at = request_id.find(MARK)
    parts = request_id[at + len(MARK) :].split(SEP, 2) if at >= 0 else []
    if len(parts) < 3 or not parts[0]:
        return ""
    tenant, own, rest = parts
    return tenant if hmac.compare_digest(rest[:DIGEST_CHARS], _digest(key, tenant, own)) else ""


class TenantMiddleware:
    """ASGI middleware for vLLM's API server: each POST's tenant label into its request id.

    ``header`` defaults to ``KCOPS_TENANT_HEADER``, ``key`` to :func:`tenant_key`; a bad
    header name refuses the server's start with a message naming it."""

    def __init__(self, app: ASGIApp, header: str | None = None, key: bytes | None = None) -> None:
        self.app = app
        if header is None:
            header = os.environ.get("KCOPS_TENANT_HEADER", DEFAULT_HEADER).strip()
        self._header = check_header_name(header).lower().encode() if header else None
        self.key = tenant_key() if key is None else key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = list(scope.get("headers") or ())
        raw = self._header_value(headers)
        replay: list[Message] = []
        body: dict[str, Any] | None = None
        responses = str(scope.get("path", "")).endswith("/responses")
        if _is_json(headers):
            replay, data = await _read_body(receive)
            if responses or b'"request_id"' in data or (raw is None and b'"user"' in data):
                body = _object(data)
        if raw is None and body is not None and isinstance(body.get("user"), str):
            raw = body["user"]
        tenant = clean(raw)
        sent = next((v.decode("latin-1") for k, v in headers if k == REQUEST_ID), None)
        own = sent or uuid.uuid4().hex
        headers = [(k, v) for k, v in headers if k != REQUEST_ID]
        headers.append((REQUEST_ID, mark(self.key, tenant, own).encode("latin-1")))
        if body is not None and (BODY_ID in body or responses):
            theirs = body.get(BODY_ID)
            body[BODY_ID] = mark(
                self.key, tenant, theirs if isinstance(theirs, str) and theirs else own
            )
            data = json.dumps(body).encode()
            replay = [{"type": "http.request", "body": data, "more_body": False}]
            headers = [(k, v) for k, v in headers if k != b"content-length"]
            headers.append((b"content-length", str(len(data)).encode()))
        inner = dict(scope, headers=headers)

        async def receive_again() -> Message:
            return replay.pop(0) if replay else await receive()

        async def send_back(message: Message) -> None:
            if message.get("type") == "http.response.start":
                given = list(message.get("headers") or ())
                out = [(k, v) for k, v in given if k.lower() != REQUEST_ID]
                # vLLM's echo of the id (--enable-request-id-headers), or the client's:
                # the id without the marker, as vLLM alone would have answered
                if sent is not None or len(out) < len(given):
                    out.append((REQUEST_ID, (sent or own).encode("latin-1")))
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
    """A body FastAPI reads as JSON: no content type, ``application/json`` or ``+json``."""
    ctype = next((v for k, v in headers if k == b"content-type"), b"")
    ctype = ctype.split(b";")[0].strip().lower()
    return ctype in (b"", b"application/json") or (
        ctype.startswith(b"application/") and ctype.endswith(b"+json")
    )


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


def _object(body: bytes) -> dict[str, Any] | None:
    """A JSON body's object (None: not one)."""
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):  # vLLM refuses it too: nothing runs
        return None
    return obj if isinstance(obj, dict) else None
