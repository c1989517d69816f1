"""Bearer-token check for everything that changes state.

The token comes from ``$KCOPS_TOKEN`` or a token file. With no token
configured, every mutating request is refused (401): never open.
"""

from __future__ import annotations

import base64
import hmac
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from kcops.errors import ConfigError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


MAX_TOKEN_BYTES = 4096


def check_token(token: str, source: str) -> str:
    """``token`` if it is one: visible ASCII (RFC 6750's bearer characters are a subset),
    no space or control character inside; else a one-line ConfigError naming ``source``.

    The environment hands undecodable bytes over as surrogates (``surrogateescape``):
    those are named as not UTF-8, never a traceback where the token is first encoded.
    """
    raw = token.encode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: the token is not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise ConfigError(f"{source}: the token is {len(raw)} bytes; at most {MAX_TOKEN_BYTES}")
    bad = next((i for i, c in enumerate(token) if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ConfigError(
            f"{source}: the token may hold only visible ASCII characters; found "
            f"{token[bad]!r} at offset {bad}"
        )
    return token


def read_token_file(token_file: Path, option: str = "--token-file") -> str:
    """The token a file holds (surrounding whitespace dropped), checked by :func:`check_token`."""
    try:
        with open(token_file, "rb") as fh:
            raw = fh.read(MAX_TOKEN_BYTES + 64)
    except OSError as exc:
        raise ConfigError(f"{option} {token_file}: cannot read: {exc.strerror or exc}") from None
    token = raw.strip().decode("utf-8", "surrogateescape")
    if not token:
        raise ConfigError(f"{option} {token_file}: file is empty")
    return check_token(token, f"{option} {token_file}")


def load_token(token_file: Path | None = None, env: dict[str, str] | None = None) -> str | None:
    """The configured token, or None. A token file that cannot be read, or a token (file or
    ``$KCOPS_TOKEN``) that is not UTF-8 or holds other than visible ASCII, is a ConfigError."""
    env = os.environ if env is None else env  # type: ignore[assignment]
    if token_file is not None:
        return read_token_file(Path(token_file))
    token = (env or {}).get("KCOPS_TOKEN", "").strip()
    return check_token(token, "KCOPS_TOKEN") if token else None


class TokenCheck:
    """Constant-time comparison of a request's credentials with the token.

    Accepts ``Authorization: Bearer <token>``, and ``Basic`` with the token as
    the password (how Alertmanager's ``basic_auth`` sends it).
    """

    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    @property
    def token(self) -> str | None:
        """The token itself, for the agent's own calls to the engine's admin API."""
        return self._token.decode() if self._token is not None else None

    @property
    def configured(self) -> bool:
        return self._token is not None

    def check(self, authorization: str | None) -> bool:
        if self._token is None or not authorization:
            return False
        scheme, _, cred = authorization.strip().partition(" ")
        scheme = scheme.lower()
        if scheme == "bearer":
            # aiohttp keeps non-UTF-8 header bytes as surrogates: compare the raw bytes (no 500)
            given = cred.strip().encode("utf-8", "surrogateescape")
        elif scheme == "basic":
            try:
                decoded = base64.b64decode(cred.strip(), validate=True).decode()
            except (ValueError, UnicodeDecodeError):
                return False
            given = decoded.partition(":")[2].encode()
        else:
            return False
        return hmac.compare_digest(given, self._token)

    def require(self, handler: Handler) -> Handler:
        """Wrap an aiohttp handler so it answers 401 without valid credentials."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            if not self.check(request.headers.get("Authorization")):
                reason = (
                    "no token configured on the agent: set KCOPS_TOKEN or --token-file"
                    if not self.configured
                    else "missing or wrong bearer token"
                )
                return web.json_response(
                    {"error": "unauthorized", "detail": reason},
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="kcops"'},
                )
            return await handler(request)

        wrapped.__name__ = getattr(handler, "__name__", "handler")
        return wrapped
