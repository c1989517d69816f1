"""Fault injection for drills (``--enable-faults`` only): NaN, latency, held memory, hang.

Each fault reproduces an alert honestly: NaN goes into the attention output (the
probe counts it), latency delays every request, held memory is really allocated
and touched (it shows in the process RSS), and a hang stops the request loop and
``/health`` until cleared (or the process is restarted).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

MAX_HOLD_BYTES = 64 * 1024**3
MAX_LATENCY_MS = 600_000


class BadFault(ValueError):
    """An invalid fault request; the message says what is allowed."""


@dataclass
class Faults:
    nan: bool = False
    latency_ms: float = 0.0
    hang: bool = False
    _held: list[bytearray] = field(default_factory=list)
    unhung: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.unhung.set()

    @property
    def held_bytes(self) -> int:
        return sum(len(b) for b in self._held)

    def state(self) -> dict[str, Any]:
        return {
            "nan": self.nan,
            "latency_ms": self.latency_ms,
            "hold_memory_bytes": self.held_bytes,
            "hang": self.hang,
        }

    def apply(self, body: Any) -> dict[str, Any]:
        """Apply one fault request; returns ``{"before": ..., "after": ...}``."""
        if not isinstance(body, dict) or not body:
            raise BadFault(
                'expected an object: {"nan": true}, {"latency_ms": N}, '
                '{"hold_memory_bytes": N}, {"hang": true} or {"clear": true}'
            )
        known = {"nan", "latency_ms", "hold_memory_bytes", "hang", "clear"}
        unknown = set(body) - known
        if unknown:
            raise BadFault(f"unknown fault(s) {sorted(unknown)}: use {sorted(known)}")
        ms = body.get("latency_ms", 0)
        if "latency_ms" in body and (
            isinstance(ms, bool)
            or not isinstance(ms, int | float)
            or not 0 <= ms <= MAX_LATENCY_MS  # NaN fails both comparisons
        ):
            raise BadFault(f"latency_ms must be a number in [0, {MAX_LATENCY_MS}], got {ms!r}")
        n = body.get("hold_memory_bytes", 0)
        if "hold_memory_bytes" in body and (
            isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_HOLD_BYTES
        ):
            raise BadFault(f"hold_memory_bytes must be an integer in [0, {MAX_HOLD_BYTES}]")
        # Everything is valid: only now change state, so a refused request changes nothing.
        before = self.state()
        if body.get("clear"):
            self.clear()
        if "nan" in body:
            self.nan = bool(body["nan"])
        if "latency_ms" in body:
            self.latency_ms = float(ms)
        if n:
            # Multiplying a one-byte array writes every byte: the pages become resident.
            self._held.append(bytearray(b"\x01") * n)
        if "hang" in body:
            self.hang = bool(body["hang"])
            if self.hang:
                self.unhung.clear()
            else:
                self.unhung.set()
        return {"before": before, "after": self.state()}

    def clear(self) -> None:
        self.nan = False
        self.latency_ms = 0.0
        self._held.clear()
        self.hang = False
        self.unhung.set()
