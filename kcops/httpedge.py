"""The edge of kcops's HTTP servers (agent and worker): protocol errors as JSON, in one log line.

aiohttp answers a request it cannot parse (a bad request line, a header too long,
``Content-Length: abc``, a broken chunk) itself, before any middleware runs: a
``text/plain`` 400, and a full traceback on ``aiohttp.server`` at ERROR. Both
servers run through :class:`JsonErrorRunner` instead, which answers those with
the server's own JSON error body, and :class:`OneLineErrors` turns every record
of ``aiohttp.server`` that carries an exception into one line (a client's bad
bytes are a warning, not a bug), with the bad bytes cut to an excerpt.

:func:`body_deadline` reads a request's whole body before the handler runs, under
a deadline: a client that stops sending mid-body (or whose broken chunk
aiohttp's C parser queues behind the request instead of failing its body)
gets a JSON 408 instead of holding a handler for as long as it stays connected.

The runner swaps aiohttp's request handler class for a subclass that only
replaces :meth:`handle_error`; it relies on ``Server``'s ``_loop`` and
``_kwargs`` (aiohttp 3.x). ``tests/faults/test_malformed_http.py`` sends raw
malformed requests to both servers and fails if that stops holding.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware
from aiohttp.web_protocol import RequestHandler

ErrorBody = Callable[[int, str], dict[str, object]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_DETAIL_CHARS = 200
BODY_TIMEOUT_S = 10.0  # LAN and loopback clients send a body in milliseconds


def one_line(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters (an excerpt of a client's bytes)."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def describe(exc: BaseException) -> str:
    if isinstance(exc, HttpProcessingError):
        return one_line(exc.message or HTTPStatus(exc.code or 400).phrase)
    return one_line(f"{type(exc).__name__}: {exc}")


class OneLineErrors(logging.Filter):
    """Drop the traceback of every record, keep one line naming the exception.

    A protocol error is a client's fault: logged at WARNING, not ERROR.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        info = record.exc_info
        exc = info[1] if isinstance(info, tuple) else None
        if exc is None:
            return True
        record.msg = f"{record.getMessage()}: {describe(exc)}"
        record.args = None
        record.exc_info = None
        record.exc_text = None
        if isinstance(exc, HttpProcessingError) and record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_FILTER = OneLineErrors()


def quiet_aiohttp_server_log() -> None:
    """Install :class:`OneLineErrors` on ``aiohttp.server`` (once; idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


class _JsonErrorHandler(RequestHandler):
    error_body: ErrorBody

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        # aiohttp's own: logs (one line, by the filter), and refuses when bytes went out.
        super().handle_error(request, status, exc, message)
        if status >= 500:
            text = "internal error" if status == 500 else HTTPStatus(status).phrase.lower()
        else:
            why = describe(exc) if exc is not None else one_line(message or "")
            text = "bad HTTP request: " + why
        resp = web.json_response(self.error_body(status, text), status=status)
        resp.force_close()
        return resp


class _JsonErrorServer(web.Server):
    def __init__(self, *args: Any, error_body: ErrorBody, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.error_body = error_body

    def __call__(self) -> RequestHandler:
        handler = _JsonErrorHandler(self, loop=self._loop, **self._kwargs)
        handler.error_body = self.error_body
        return handler


class JsonErrorRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` whose protocol-level errors are JSON ``error_body``s."""

    def __init__(self, app: web.Application, error_body: ErrorBody, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._error_body = error_body
        quiet_aiohttp_server_log()

    async def _make_server(self) -> web.Server:
        base = await super()._make_server()  # the app's startup, frozen router
        return _JsonErrorServer(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            error_body=self._error_body,
            **base._kwargs,
        )


def body_deadline(error_body: ErrorBody, timeout_s: float = BODY_TIMEOUT_S) -> Middleware:
    """A middleware reading the body first (aiohttp keeps it for the handler) within ``timeout_s``.

    Past the deadline: a JSON 408 (``error_body``). Too large a body raises aiohttp's 413
    as before, for the server's error middleware to answer.
    """

    @web.middleware
    async def read_first(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.can_read_body:
            try:
                await asyncio.wait_for(request.read(), timeout=timeout_s)
            except TimeoutError:
                text = f"request body not received within {timeout_s:g}s"
                resp = web.json_response(error_body(408, text), status=408)
                resp.force_close()
                return resp
        return await handler(request)

    return read_first
