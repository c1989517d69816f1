"""Conventions shared by every command: agent URL, exit codes, HTTP."""

from __future__ import annotations

import functools
import json
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from kcops.errors import ConfigError, KcopsError, Unreachable

if TYPE_CHECKING:
    import httpx

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

DEFAULT_AGENT = "http://127.0.0.1:9464"

F = TypeVar("F", bound=Callable[..., object])


def agent_option(fn: F) -> F:
    """``--agent URL`` (env ``KCOPS_AGENT``), for commands that talk to a running agent."""
    return click.option(
        "--agent",
        "agent_url",
        envvar="KCOPS_AGENT",
        default=DEFAULT_AGENT,
        show_default=True,
        help="Base URL of a running kcops agent.",
    )(fn)


def handle_errors(fn: F) -> F:
    """Turn kcops's typed errors into a one-line message and their exit codes."""

    @functools.wraps(fn)
    def wrapped(*args: object, **kwargs: object) -> object:
        try:
            return fn(*args, **kwargs)
        except KcopsError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)

    return wrapped  # type: ignore[return-value]


class DurationParam(click.ParamType):
    """A length of time flag: seconds (``1.5``) or a Prometheus duration (``500ms``, ``2m``)."""

    name = "duration"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        from kcops.agent.duration import seconds

        try:
            return seconds(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class FiniteFloat(click.FloatRange):
    """A number flag, optionally in a range: click's FloatRange lets ``nan`` through every
    bound (no comparison with NaN is true) and ``inf`` past an open end. Every float flag
    of every command uses this one."""

    def __init__(self, min: float | None = None, max: float | None = None) -> None:
        super().__init__(min, max)

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        import math

        rv = super().convert(value, param, ctx)  # type: ignore[arg-type]
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return float(rv)


def parse_params(pairs: tuple[str, ...], option: str = "--param") -> dict[str, object]:
    """``NAME=VALUE`` flags (``--param`` of ``alerts``, ``dashboards`` and ``actions run``).

    VALUE is one YAML value read by the bounded loader, so ``0.25`` is a number,
    ``false`` a boolean and ``5m`` a string; an empty VALUE is the empty string.
    A pair without ``=``, bad YAML, or a value JSON cannot carry (``.nan``, ``.inf``, a
    timestamp, bytes, a set) is a :class:`ConfigError` (exit 2).
    """
    from kcops.agent.yamlload import excerpt, parse_yaml

    out: dict[str, object] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"{option} {excerpt(pair)}: expected NAME=VALUE")
        where = f"{option} {excerpt(name)}"
        out[name] = _json_value(parse_yaml(raw, where), where) if raw.strip() else ""
    return out


def _json_value(value: object, where: str) -> object:
    """``value`` if JSON holds it as is (the agent reads params as JSON); else ConfigError."""
    import math

    from kcops.agent.yamlload import excerpt

    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value} is not a finite number")
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, list):
        return [_json_value(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _json_value(v, where) for k, v in value.items()}
    raise ConfigError(
        f"{where}: {excerpt(value)} is a {type(value).__name__}; a value is a number, a "
        "string, true/false, or a list or mapping of those (quote it to pass text)"
    )


def token_headers(token_file: str | None = None) -> dict[str, str]:
    """Authorization header from the one token loader (``kcops.auth.load_token``)."""
    from pathlib import Path

    from kcops.auth import load_token

    token = load_token(Path(token_file) if token_file else None)
    return {"Authorization": f"Bearer {token}"} if token else {}


def agent_request(
    method: str,
    agent_url: str,
    path: str,
    *,
    json_body: object = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 5.0,
) -> httpx.Response:
    """One HTTP call to the agent; a connection failure raises :class:`Unreachable`.

    A GET that the agent's query API refuses for the moment is asked again
    (:func:`retry_unavailable`)."""
    import httpx  # not at module level: `kcops agent run` imports this module and never calls

    url = agent_url.rstrip("/") + path

    def send() -> httpx.Response:
        try:
            return httpx.request(method, url, json=json_body, headers=headers, timeout=timeout_s)
        except httpx.InvalidURL as exc:
            raise ConfigError(f"--agent {agent_url!r}: not a valid URL: {exc}") from None
        except httpx.HTTPError as exc:
            raise Unreachable(f"cannot reach the agent at {agent_url}: {exc}") from None

    return retry_unavailable(send) if method == "GET" else send()


# Waits between the tries of a GET the query API refused for the moment: 0.25 s doubling
# to 2 s, then every 2 s, 29.75 s in all. The agent's share of its loop for queries
# refills at 0.5 s a second and a query's whole evaluation time is charged to it, so one
# slow query on a loaded box can leave it seconds in debt (a clean-clone `make test`
# met the refusal after 3.75 s of waiting).
RETRY_UNAVAILABLE_S: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0, *(2.0,) * 13)


def retry_unavailable(send: Callable[[], httpx.Response]) -> httpx.Response:
    """``send()``, and again after each wait of :data:`RETRY_UNAVAILABLE_S` while the
    agent answers 503 ``unavailable`` (the query API's share of the agent's loop is spent,
    or too many queries at once: "retry shortly"). The last answer otherwise, so a CLI
    that asks many queries (``kcops top``, ``kcops report``) waits for the agent rather
    than failing. Other errors, a 503 ``timeout`` (the query itself too costly) among
    them, are answered at once."""
    import time

    for wait_s in (*RETRY_UNAVAILABLE_S, None):
        resp = send()
        if wait_s is None or not is_unavailable(resp):
            return resp
        time.sleep(wait_s)
    raise AssertionError("unreachable")  # the loop returns on its last pass


def is_unavailable(resp: httpx.Response) -> bool:
    """The query API's momentary refusal: 503 with Prometheus's ``errorType: unavailable``."""
    if resp.status_code != 503:
        return False
    try:
        doc = resp.json()
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("errorType") == "unavailable"


# A JSON object the agent's API answered, read by key to print it: its schema is the
# agent's (the routes' own tests hold it), and the CLI does not restate it as types.
Doc = dict[str, Any]


def agent_get_json(agent_url: str, path: str) -> Any:
    resp = agent_request("GET", agent_url, path)
    if resp.status_code >= 400:
        raise KcopsError(f"GET {path}: HTTP {resp.status_code}: {resp.text[:300]}")
    return resp.json()


# C0 and C1 controls, line and paragraph separators, bidi overrides: what could split a
# row, rewrite the terminal or reorder what on-call reads.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def one_line(text: object) -> str:
    """``text`` as one printable line: each control character written as its escape
    (a newline as ``\\n``), so a value from outside (a label, a model name) cannot split
    a row of a table or drive the terminal."""
    return _UNPRINTABLE.sub(lambda m: m[0].encode("unicode_escape").decode(), str(text))


def echo_json(data: object) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))
