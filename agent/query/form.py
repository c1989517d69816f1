"""What the instant and the range query share: the request's parameters, the answer's
shape, and how a failure maps to Prometheus's error types (see :mod:`.component`)."""

from __future__ import annotations

import math
from urllib.parse import parse_qsl

from aiohttp import web
from multidict import MultiDict, MultiMapping

from kcops.agent.promql.budget import QueryTimeout
from kcops.agent.promql.model import EvalError, RuleError
from kcops.agent.query.gate import QueryUnavailable

MAX_QUERY_CHARS = 4000


FORM = "application/x-www-form-urlencoded"


class FormError(ValueError):
    """A POST query whose body is not a form."""


async def query_params(request: web.Request) -> MultiMapping[str]:
    """A query's parameters, as Prometheus takes them: in the URL, and for POST also as a
    form body (Grafana's Prometheus data source posts by default); the body's first.
    Raises FormError for a POST body that is not a form."""
    if request.method != "POST" or not request.body_exists:
        return request.query
    if request.content_type != FORM:
        raise FormError(
            f"a POST query's parameters go in a {FORM} body, not {request.content_type}"
        )
    raw = await request.read()  # within the server's body size limit
    try:
        pairs = parse_qsl(
            raw.decode("utf-8"), keep_blank_values=True, errors="strict", max_num_fields=64
        )
    except ValueError as exc:  # UnicodeDecodeError is one: bytes or %-escapes
        raise FormError(f"the {FORM} body cannot be read: {str(exc)[:120]}") from None
    merged: MultiDict[str] = MultiDict(pairs)
    merged.extend(request.query)
    return merged


def parse_time(text: str) -> float | None:
    try:
        t = float(text)
    except ValueError:
        return None
    return t if math.isfinite(t) else None


def failure_response(exc: Exception) -> web.Response:
    """The error answer for an exception of parse or evaluation, as Prometheus maps its own."""
    if isinstance(exc, RuleError):
        return error_response("bad_data", str(exc))
    if isinstance(exc, QueryUnavailable):
        return error_response("unavailable", str(exc), status=503)
    if isinstance(exc, QueryTimeout):
        return error_response("timeout", str(exc), status=503)
    if isinstance(exc, EvalError):
        return error_response("execution", str(exc), status=422)
    return error_response("execution", f"unexpected error: {type(exc).__name__}: {exc}", 422)


def error_response(kind: str, message: str, status: int = 400) -> web.Response:
    """Prometheus's HTTP API error shape; the message is cut to 1000 characters."""
    if len(message) > 1000:
        message = message[:997] + "..."
    return web.json_response(
        {"status": "error", "errorType": kind, "error": message}, status=status
    )
