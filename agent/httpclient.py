"""The agent's HTTP client: aiohttp's, which the control API loads anyway.

The agent's own HTTP (engine poll, admin calls, notify/page webhook) is this one
stack. One :class:`HttpClient` per engine, shared by the poll and the admin calls:
keep-alive connections (at most four), no proxy from the environment, a total
deadline per request. (httpx cost three times as much per poll and ~7 MiB more.)

Network trouble raises :class:`HttpError` with a ``reason`` the collectors
count. None of them is a :class:`TimeoutError`: an engine call that times out
is a failed step, not the runner's own action timeout.

The session is made on first use, on the running loop, and must be used from
that loop only (the agent has one).
"""

from __future__ import annotations

import json as jsonlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

MAX_CONNECTIONS = 4
CHUNK_BYTES = 1 << 16


class HttpError(Exception):
    """A request that got no usable HTTP answer. ``reason``: timeout | connect | protocol | ..."""

    reason = "http_error"


class HttpTimeout(HttpError):
    reason = "timeout"


class HttpConnectError(HttpError):
    reason = "connect"


class HttpProtocolError(HttpError):
    reason = "protocol"


class BodyTooLarge(HttpError):
    reason = "too_large"


@dataclass(frozen=True)
class Response:
    status_code: int
    content: bytes
    headers: Mapping[str, str]

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; raises ValueError when it is not."""
        return jsonlib.loads(self.content)


def _error(url: str, exc: BaseException, timeout_s: float) -> HttpError:
    if isinstance(exc, TimeoutError):
        return HttpTimeout(f"{url}: no answer within {timeout_s:g}s")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return HttpConnectError(f"{url}: cannot connect ({exc.os_error or exc})")
    if isinstance(
        exc,
        aiohttp.ServerDisconnectedError
        | aiohttp.ClientPayloadError
        | aiohttp.ClientResponseError
        | aiohttp.ClientOSError,
    ):
        return HttpProtocolError(f"{url}: {type(exc).__name__}: {exc}")
    return HttpError(f"{url}: {type(exc).__name__}: {exc}")


class HttpClient:
    """A small aiohttp client: ``request`` returns the whole (bounded) body or raises HttpError."""

    def __init__(self, timeout_s: float = 5.0, *, trust_env: bool = False) -> None:
        self.timeout_s = timeout_s
        # The engine is next door: no proxy. A webhook may be outside: HTTP(S)_PROXY apply.
        self.trust_env = trust_env
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                trust_env=self.trust_env,
                auto_decompress=True,
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        url: str,
        *,
        json: object = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
        limit: int | None = None,
    ) -> Response:
        """One request under a total deadline; the body is read whole, at most ``limit`` bytes."""
        deadline = self.timeout_s if timeout_s is None else timeout_s
        try:
            async with self._get_session().request(
                method,
                url,
                json=json,
                params=params,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=deadline),
            ) as r:
                body = await _read(r, url, limit)
                return Response(r.status, body, r.headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _error(url, exc, deadline) from None

    async def get(self, url: str, **kw: Any) -> Response:
        return await self.request("GET", url, **kw)


async def _read(r: aiohttp.ClientResponse, url: str, limit: int | None) -> bytes:
    if limit is None:
        return await r.read()
    if r.content_length is not None and r.content_length > limit:
        raise BodyTooLarge(f"{url}: body over {limit} bytes")
    chunks, size = [], 0
    async for chunk in r.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"{url}: body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
