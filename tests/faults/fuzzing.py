"""Hypothesis strategies for hostile HTTP requests, and the checks every answer must pass.

A request is (method, path, query, body bytes, headers). Bodies mix arbitrary JSON,
raw bytes, hostile literals no JSON encoder writes (a 5,000-digit integer, a lone
surrogate, NaN, deep nesting), and per-route documents whose known keys hold values of
the wrong type, so that the typed layers are reached too, not only the JSON parser.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from hypothesis import strategies as st


@dataclass
class Req:
    method: str
    path: str
    body: bytes | None = None
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=20,
)  # fmt: skip

# Values of the wrong type (or out of range) for a typed field.
hostile_values = st.sampled_from(
    [None, True, False, 0, -1, 1, 2.5, -1e308, 10**30, "", "yes", "false", "5", "x" * 5000,
     [], [1, "a"], {}, {"a": {"b": 1}}, "\u0000", "../../etc/passwd"]
)  # fmt: skip

# Raw bodies no JSON encoder writes.
hostile_literals = st.sampled_from(
    [
        b'{"a": 1' + b"0" * 5000 + b"}",
        b'{"a": "\\ud800"}',
        b'{"a": NaN, "b": -Infinity}',
        b"[" * 50_000 + b"]" * 50_000,
        b'{"a": 1e999}',
        b"\xff\xfe\xfd",
        b'{"a": "\xc3"}',
        b"",
        b"null",
        b"{" * 10,
    ]
)


def document(
    keys: dict[str, st.SearchStrategy[Any]],
    required: dict[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[bytes]:
    """A JSON object of some of ``keys`` (each holding its value strategy or a hostile one)
    and all of ``required`` (as given)."""
    entries = {k: v | hostile_values for k, v in keys.items()}
    return st.fixed_dictionaries(required or {}, optional=entries).map(
        lambda d: json.dumps(d).encode()
    )


def bodies(
    keys: dict[str, st.SearchStrategy[Any]],
    required: dict[str, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[bytes]:
    return (
        document(keys, required)
        | json_values.map(lambda v: json.dumps(v).encode())
        | st.binary(max_size=200)
        | hostile_literals
    )


query_values = st.text(max_size=40) | st.sampled_from(
    ["NaN", "Inf", "-Inf", "1e400", "-1", "0", "1" + "0" * 400, "\x00", "%ff", "1.5"]
)


def _refuse_constant(name: str) -> None:
    raise AssertionError(f"bare {name} in a JSON answer")


def check_answer(r: httpx.Response, what: object, allow: tuple[int, ...] = ()) -> None:
    """No 5xx (but those in ``allow``, a route's documented answers); an error is JSON with
    "error"; a JSON answer has no bare NaN or Infinity."""
    assert r.status_code < 500 or r.status_code in allow, (what, r.status_code, r.text[:300])
    assert "Traceback" not in r.text, (what, r.text[:300])
    ctype = r.headers.get("content-type", "")
    if r.status_code >= 400:
        assert ctype.startswith("application/json"), (what, r.status_code, ctype, r.text[:200])
        assert "error" in r.json(), (what, r.text[:200])
    elif ctype.startswith("application/json"):
        json.loads(r.text, parse_constant=_refuse_constant)


def send(client: httpx.Client, base: str, req: Req) -> httpx.Response:
    return client.request(
        req.method,
        base + req.path,
        params=req.query,
        content=req.body,
        headers=req.headers,
    )
