"""JSON in and out of the control API: strict request bodies, typed refusals, JSON answers.

Every route's handler uses these, whichever part of the agent serves it:
:func:`read_json_model` parses a body into a pydantic model (strict: ``"false"`` is not a
boolean) or raises :class:`BadRequest` (400/422), which the control API's middleware
answers as JSON; :func:`json_dumps` writes NaN and infinities as null.
"""

from __future__ import annotations

import json
import math
from typing import TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class BadRequest(Exception):
    """A request the API refuses; becomes a JSON answer with ``status``."""

    def __init__(self, status: int, error: str, details: list[dict[str, str]] | None = None):
        super().__init__(error)
        self.status = status
        self.error = error
        self.details = details or []


def json_dumps(obj: object) -> str:
    """JSON text of ``obj`` with NaN and infinities as null: JSON has no such numbers
    (clients choke on a bare NaN). For every answer that may hold a measured float."""
    return json.dumps(_jsonable(obj), default=str)


def _jsonable(obj: object) -> object:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    return obj


def error_body(status: int, error: str) -> dict[str, object]:
    """The JSON body of every error answer (also aiohttp's protocol errors, kcops.httpedge)."""
    del status  # the status line carries it
    return {"error": error[:500]}


def error_response(
    status: int, error: str, details: list[dict[str, str]] | None = None
) -> web.Response:
    body = error_body(status, error)
    if details:
        body["details"] = details[:20]
    return web.json_response(body, status=status)


class _NotJson(ValueError):
    pass


def _constant(name: str) -> object:
    raise _NotJson(f"bare {name} is not JSON (RFC 8259 has no such number)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotJson(f"the number {text[:40]} is out of range")
    return value


def _no_repeats(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _NotJson(f"the key {key[:60]!r} appears twice in one object")
            seen.add(key)
    return out


def strict_json(text: str) -> object:
    """``json.loads`` without Python's extensions: no bare ``NaN``/``Infinity``, no number
    that overflows to infinity (``1e999``), no key twice in one object."""
    return json.loads(
        text, parse_constant=_constant, parse_float=_finite, object_pairs_hook=_no_repeats
    )


async def read_json(request: web.Request) -> object:
    """The JSON body (strict: :func:`strict_json`), or BadRequest 400 (not JSON, not UTF-8,
    nested too deeply, NaN)."""
    raw = await request.read()
    try:
        return strict_json(raw.decode("utf-8")) if raw else {}
    except _NotJson as exc:
        raise BadRequest(400, f"body is not a JSON document: {exc}") from None
    except (ValueError, RecursionError):
        raise BadRequest(400, "body is not a JSON document (UTF-8)") from None


async def read_json_model(request: web.Request, model: type[M]) -> M:
    """The body validated by ``model`` (strict types), or BadRequest 400/422 naming the fields."""
    body = await read_json(request)
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as exc:
        details = [
            {"field": ".".join(str(p) for p in e["loc"]) or "<body>", "problem": e["msg"][:200]}
            for e in exc.errors()
        ]
        raise BadRequest(422, "invalid request body", details) from None
