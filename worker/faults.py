"""Fault injection for drills (``--enable-faults`` only).

Each fault reproduces an alert honestly, through the mechanism that causes it
in production, never by writing a metric:

- ``nan``: NaN goes into the attention output (the probe counts it);
- ``latency_ms``: every request waits before its prefill (time to first token);
- ``token_delay_ms``: every decode step waits, so each decoded token comes
  that much later (inter-token latency);
- ``hold_memory_bytes``: memory really allocated and touched (process RSS);
  past a memory limit the kernel's OOM killer ends the process;
- ``memory_ramp_bytes_per_s`` (with ``memory_ramp_to_bytes``): held memory
  that grows steadily, as a leak does, up to a cap;
- ``hang``: the request loop and ``/health`` stop until cleared (or restarted);
- ``stall``: the model loop stops (no token, no step) while ``/health`` and
  ``/metrics`` still answer and requests stay pending: an engine core stopped
  behind a live API server (vLLM's EngineCore under SIGSTOP);
- ``cache_budget_bytes``: the KV cache's memory tier may grow to this many
  bytes (a budget larger than the device holds, as a misconfigured engine's
  is); traffic with new prefixes then fills it with real KV blocks, which an
  eviction frees. 0 puts the configured budget back (blocks past it dropped).

A start delay (``kcops serve --start-delay-file``) is read at start, not here:
see :func:`start_delay_s`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

MAX_HOLD_BYTES = 64 * 1024**3
MAX_LATENCY_MS = 600_000
MAX_START_DELAY_S = 3600.0
RAMP_STEP_BYTES = 4 * 1024**2  # the ramp allocates in steps of at least this much

KNOWN = (
    "nan", "latency_ms", "token_delay_ms", "hold_memory_bytes",
    "memory_ramp_bytes_per_s", "memory_ramp_to_bytes", "hang", "stall", "cache_budget_bytes",
    "clear",
)  # fmt: skip


class BadFault(ValueError):
    """An invalid fault request; the message says what is allowed."""


def _ms(body: dict[str, object], key: str) -> float | None:
    if key not in body:
        return None
    ms = body[key]
    if isinstance(ms, bool) or not isinstance(ms, int | float) or not 0 <= ms <= MAX_LATENCY_MS:
        # NaN fails both comparisons
        raise BadFault(f"{key} must be a number in [0, {MAX_LATENCY_MS}], got {ms!r}")
    return float(ms)


def _bytes(body: dict[str, object], key: str) -> int | None:
    if key not in body:
        return None
    n = body[key]
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_HOLD_BYTES:
        raise BadFault(f"{key} must be an integer in [0, {MAX_HOLD_BYTES}], got {n!r}")
    return n


def _touched(n: int) -> torch.Tensor:
    """``n`` bytes allocated and written, so the pages are resident.

    torch fills them with the GIL released: a hold of a gigabyte or more (the OOM
    drill's, which must end in the kernel's OOM kill) leaves the worker's HTTP loop
    answering meanwhile. A bytearray fill held the GIL, so the worker also looked
    hung while it wrote, and a hang is a different failure, with its own remedy."""
    return torch.ones(n, dtype=torch.uint8)


def _touched_small(n: int) -> bytearray:
    """A ramp's step (a few MiB, written in well under a tick): a bytearray, whose pages
    stay resident and counted in the process's RSS (torch's blocks were not, measured)."""
    return bytearray(b"\x01") * n


@dataclass
class Ramp:
    """Held memory growing at ``bytes_per_s`` from ``started_s`` up to ``to_bytes``."""

    bytes_per_s: int
    to_bytes: int
    started_s: float | None = None  # set by the first tick: time comes from the engine's clock
    held: list[bytearray] = field(default_factory=list)

    @property
    def held_bytes(self) -> int:
        return sum(len(b) for b in self.held)

    def due_bytes(self, now: float) -> int:
        if self.started_s is None:
            self.started_s = now
        return min(self.to_bytes, int(self.bytes_per_s * max(0.0, now - self.started_s)))

    def tick(self, now: float) -> int:
        """Allocate what is due by ``now`` (in steps, not byte by byte); bytes added."""
        missing = self.due_bytes(now) - self.held_bytes
        full = self.held_bytes + missing >= self.to_bytes
        if missing <= 0 or (missing < RAMP_STEP_BYTES and not full):
            return 0
        self.held.append(_touched_small(missing))
        return missing


@dataclass
class Faults:
    nan: bool = False
    latency_ms: float = 0.0
    token_delay_ms: float = 0.0
    hang: bool = False
    stall: bool = False
    ramp: Ramp | None = None
    cache_budget_bytes: int | None = None  # a drill's budget of the KV memory tier
    # Sets the cache's budget (None: the configured one); wired by the worker's app.
    resize_cache: Callable[[int | None], None] | None = None
    _held: list[torch.Tensor] = field(default_factory=list)
    # Set while the model loop may run: neither hung nor stalled.
    unhung: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.unhung.set()

    @property
    def held_bytes(self) -> int:
        ramped = self.ramp.held_bytes if self.ramp is not None else 0
        return sum(len(b) for b in self._held) + ramped

    def state(self) -> dict[str, object]:
        return {
            "nan": self.nan,
            "latency_ms": self.latency_ms,
            "token_delay_ms": self.token_delay_ms,
            "hold_memory_bytes": self.held_bytes,
            "memory_ramp": None
            if self.ramp is None
            else {"bytes_per_s": self.ramp.bytes_per_s, "to_bytes": self.ramp.to_bytes},
            "hang": self.hang,
            "stall": self.stall,
            "cache_budget_bytes": self.cache_budget_bytes,
        }

    def apply(self, body: object) -> dict[str, object]:
        """Apply one fault request; returns ``{"before": ..., "after": ...}``."""
        if not isinstance(body, dict) or not body:
            raise BadFault(
                'expected an object: {"nan": true}, {"latency_ms": N}, {"token_delay_ms": N}, '
                '{"hold_memory_bytes": N}, {"memory_ramp_bytes_per_s": N, '
                '"memory_ramp_to_bytes": M}, {"hang": true}, {"stall": true}, '
                '{"cache_budget_bytes": N} '
                'or {"clear": true}'
            )
        unknown = set(body) - set(KNOWN)
        if unknown:
            raise BadFault(f"unknown fault(s) {sorted(unknown)}: use {sorted(KNOWN)}")
        latency, token_delay = _ms(body, "latency_ms"), _ms(body, "token_delay_ms")
        hold = _bytes(body, "hold_memory_bytes")
        ramp = self._ramp(body)
        budget = _bytes(body, "cache_budget_bytes")
        if budget is not None and self.resize_cache is None:
            raise BadFault("cache_budget_bytes: this worker has no KV cache to resize")
        # Everything is valid: only now change state, so a refused request changes nothing.
        before = self.state()
        if body.get("clear"):
            self.clear()
        if "nan" in body:
            self.nan = bool(body["nan"])
        if latency is not None:
            self.latency_ms = latency
        if token_delay is not None:
            self.token_delay_ms = token_delay
        if hold:
            self._held.append(_touched(hold))
        if ramp is not None:
            self.ramp = ramp if ramp.bytes_per_s > 0 else None
        if "hang" in body:
            self.hang = bool(body["hang"])
        if "stall" in body:
            self.stall = bool(body["stall"])
        self._gate()
        if budget is not None:
            self._set_cache_budget(budget or None)
        return {"before": before, "after": self.state()}

    def _gate(self) -> None:
        if self.hang or self.stall:
            self.unhung.clear()
        else:
            self.unhung.set()

    @staticmethod
    def _ramp(body: dict[str, object]) -> Ramp | None:
        rate = _bytes(body, "memory_ramp_bytes_per_s")
        cap = _bytes(body, "memory_ramp_to_bytes")
        if rate is None and cap is None:
            return None
        if rate is None or (rate > 0 and not cap):
            raise BadFault(
                "a memory ramp needs memory_ramp_bytes_per_s (0 stops it) and, to start, "
                "memory_ramp_to_bytes > 0 (the cap)"
            )
        return Ramp(rate, cap or 0)

    def _set_cache_budget(self, budget: int | None) -> None:
        self.cache_budget_bytes = budget
        if self.resize_cache is not None:
            self.resize_cache(budget)

    def tick(self, now: float) -> None:
        """Advance the memory ramp (called by the model loop; ``now`` in seconds)."""
        if self.ramp is not None:
            self.ramp.tick(now)

    def clear(self) -> None:
        self.nan = False
        self.latency_ms = 0.0
        self.token_delay_ms = 0.0
        self._held.clear()
        self.ramp = None
        self.hang = False
        self.stall = False
        self._gate()
        if self.cache_budget_bytes is not None:
            self._set_cache_budget(None)


def start_delay_s(path: Path) -> float:
    """Seconds a drill asks the worker to wait before loading its model.

    ``path`` holds one number of seconds; a missing or empty file means 0. Any
    other content raises :class:`BadFault` naming the file and what is allowed.
    """
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return 0.0
    except OSError as exc:
        raise BadFault(f"start delay file {path}: {exc}") from None
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= MAX_START_DELAY_S:
        raise BadFault(
            f"start delay file {path} holds {text[:40]!r}: expected seconds in "
            f"[0, {MAX_START_DELAY_S:g}]"
        )
    return value
