"""The tenant label of a request: from a header or OpenAI's ``user``, bounded and never a secret.

A tenant value becomes a Prometheus label, so two things must hold whatever
clients send:

- **bounded cardinality**: the first ``cap`` distinct accepted values keep their
  own label for the life of the process; any later new value is ``other``. So
  the label set is at most ``cap`` + 2 (``other``, ``none``) whatever the
  traffic, and a label, once given, never changes meaning;
- **no secrets**: a value that could be a credential is never exported, not even
  hashed (a hash of a key still identifies it, and distinct keys would still
  spend the cap): it is ``other``. Could-be-a-secret means: a known key or token
  prefix (``sk-``, ``pk-``, ``rk-``, ``xox``, ``ghp_``, ``gho_``, ``github_pat_``,
  ``AKIA``, ``AIza``, ``hf_``, ``glpat-``, ``Bearer``, ``eyJ`` JWTs), or 20
  characters or more that look random (at least 3.5 bits of entropy a character
  with letters and digits mixed, or all hexadecimal), or anything outside
  ``[A-Za-z0-9._:@-]`` or longer than 64 characters. OpenAI recommends hashed
  user ids in ``user``: they are ``other`` by this rule; send a readable tenant in
  the header instead.

A request with no tenant value is ``none``. ``none``, ``other`` and ``unknown`` (a request
whose tenant is not known) are kcops' own: a client that calls itself one of them, in any
case, gets a ``_`` in front (``Other`` is ``_Other``).

The cap applies where the requests are seen to run: the reference worker's handler, vLLM's
worker and the agent (:meth:`TenantLabels.bound`, for labels another process made); vLLM's
API server only makes the label (:func:`clean`).

The agent's own requests (the canary) are served and billed to nobody: the agent sends them
with an ``X-Request-Id`` of :func:`canary_id`, signed with the engine's marker key
(:func:`tenant_key`) so that no client can borrow it, and the reference worker's handler
and the probe in vLLM's worker (which sees the id inside vLLM's own) leave them uncounted.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import re
import secrets
from collections import Counter

OTHER = "other"
NONE = "none"
UNKNOWN = "unknown"
RESERVED = frozenset((OTHER, NONE, UNKNOWN))
KEY_ENV = "KCOPS_TENANT_KEY"  # the key of vLLM's tenant markers (vllm_tenant)
DEFAULT_CAP = 50
DEFAULT_HEADER = "X-Tenant"
MAX_CHARS = 64
_SAFE = re.compile(r"^[A-Za-z0-9._:@-]+$")
_HEX = re.compile(r"^[0-9a-fA-F-]+$")
_SECRET_PREFIXES = (
    "sk-", "sk_", "pk-", "pk_", "rk-", "rk_", "xox", "ghp_", "gho_", "ghs_", "github_pat_",
    "akia", "aiza", "hf_", "glpat-", "bearer", "eyj",
)  # fmt: skip
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
OWN = ""  # the tenant of the agent's own requests: served, counted for nobody
_CANARY = re.compile(r"kcops-canary-([0-9a-f]{32})-([0-9a-f]{16})")


def tenant_key() -> bytes:
    """This process's marker key: ``KCOPS_TENANT_KEY`` (the agent's supervisor passes its own
    to the engine), else one made here and put into ``os.environ``, which every process this
    one starts later inherits (vLLM's API server loads the probe's plugin, and so this,
    before it starts its engine core and workers)."""
    key = os.environ.get(KEY_ENV, "").strip()
    if not key:
        key = os.environ[KEY_ENV] = secrets.token_hex(32)
    return key.encode()


def _signed(key: bytes, nonce: str) -> str:
    return hmac.new(key, nonce.encode(), hashlib.sha256).hexdigest()[:16]


def canary_id(key: bytes) -> str:
    """A fresh request id for one of the agent's own requests, signed with ``key``."""
    nonce = secrets.token_hex(16)
    return f"kcops-canary-{nonce}-{_signed(key, nonce)}"


def is_canary(request_id: str, key: bytes) -> bool:
    """True when ``request_id`` holds a :func:`canary_id` signed with ``key`` (vLLM adds to
    an id on both sides and the tenant middleware wraps it: it is searched for)."""
    m = _CANARY.search(request_id)
    return m is not None and hmac.compare_digest(m[2], _signed(key, m[1]))


def entropy_bits(value: str) -> float:
    """Shannon entropy of the value's characters, bits per character."""
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values()) if n else 0.0


def looks_secret(value: str) -> bool:
    """True for a value that could be a key or token (the module's rule)."""
    low = value.lower()
    if low.startswith(_SECRET_PREFIXES):
        return True
    if len(value) < 20:
        return False
    if _HEX.match(value) and sum(ch.isdigit() for ch in value) >= 4:
        return True
    mixed = any(ch.isdigit() for ch in value) and any(ch.isalpha() for ch in value)
    return mixed and entropy_bits(value) >= 3.5


def check_header_name(name: str) -> str:
    """A request header name (an HTTP token); raises ValueError with the rule otherwise."""
    if not _HEADER_NAME.match(name):
        raise ValueError(f"{name!r} is not a header name (1-64 of A-Z a-z 0-9 !#$%&'*+.^_`|~-)")
    return name


def clean(raw: str | None) -> str:
    """The label for one raw tenant value, uncapped (None or empty: ``none``)."""
    if raw is None or not raw.strip():
        return NONE
    value = raw.strip()
    if len(value) > MAX_CHARS or not _SAFE.match(value) or looks_secret(value):
        return OTHER
    return "_" + value if value.lower() in RESERVED else value


class TenantLabels:
    """Maps raw tenant values to bounded, safe label values (one per process)."""

    def __init__(self, cap: int = DEFAULT_CAP, header: str | None = DEFAULT_HEADER) -> None:
        if not 1 <= cap <= 10_000:
            raise ValueError(f"tenant cap {cap!r}: allowed 1..10000")
        self.cap = cap
        self.header = check_header_name(header) if header else None
        self._known: set[str] = set()

    def label(self, raw: str | None) -> str:
        """The label for one request's raw tenant value (None or empty: ``none``)."""
        return raw if raw is not None and raw in self._known else self.bound(clean(raw))

    def bound(self, label: str) -> str:
        """A label :func:`clean` made (in another process: read back, so checked again)
        within the cap: ``none`` and ``other`` as they are, anything ``clean`` would not
        give ``other``."""
        if label in self._known or label in (NONE, OTHER):
            return label
        if clean(label) != label or len(self._known) >= self.cap:
            return OTHER
        self._known.add(label)
        return label

    def of_request(self, headers: object, user: str | None) -> str:
        """The header's value when configured and present, else OpenAI's ``user`` field;
        :data:`OWN` for the agent's canary. ``headers`` is any mapping with ``get``
        (aiohttp's are case-insensitive)."""
        if is_canary(headers.get("X-Request-Id") or "", tenant_key()):  # type: ignore[attr-defined]
            return OWN
        raw = None
        if self.header is not None:
            raw = headers.get(self.header)  # type: ignore[attr-defined]
        if raw is None or not str(raw).strip():
            raw = user
        return self.label(None if raw is None else str(raw))

    @property
    def labels(self) -> frozenset[str]:
        """Every label given so far, ``other`` and ``none`` aside."""
        return frozenset(self._known)
