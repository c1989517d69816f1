"""Compiled regexes kept within a bound of bytes, not of entries.

A count bound does not bound memory: one RE2 program ranges from a kilobyte
(``foo|bar``) to several megabytes (``\\pL{400}``), so 130 distinct large
regexes sent to the query API once held 450 MB in a cache of 1024 entries.
This cache charges each program its estimated size and evicts the least
recently used ones past :data:`REGEX_CACHE_MAX_BYTES`.

The estimate (:func:`estimate_bytes`) is :data:`BYTES_PER_INSTRUCTION` per RE2
instruction (``programsize``), at most ``max_mem`` (RE2 keeps a program and its
DFA states within it), plus :data:`ENTRY_BYTES` and the key: above every figure
measured with glibc's ``mallinfo2`` around compiling and matching 20 programs
(8 to 100 bytes per instruction compiled, up to 167 more matched;
tests/unit/promql/test_regex_bounds.py). A program whose DFA meets many more
states than it has instructions can outgrow its charge, never its ``max_mem``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

REGEX_CACHE_MAX_BYTES = 32 * 1024 * 1024
BYTES_PER_INSTRUCTION = 200
ENTRY_BYTES = 24 * 1024


def estimate_bytes(pattern: str, rx: Any, max_mem: int) -> int:
    """What one compiled regex costs, by its RE2 instruction count (see the module doc)."""
    program = min(BYTES_PER_INSTRUCTION * max(int(rx.programsize), 0), max_mem)
    return program + ENTRY_BYTES + 2 * len(pattern)


class RegexCache:
    """Least recently used compiled regexes, at most ``max_bytes`` by their estimates.

    A program larger than the whole bound is not kept (its caller holds it
    while it needs it). Safe to use from several threads.
    """

    def __init__(self, max_bytes: int = REGEX_CACHE_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.evictions = 0
        self._entries: OrderedDict[tuple[str, int], tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[str, int]) -> Any | None:
        with self._lock:
            got = self._entries.get(key)
            if got is None:
                return None
            self._entries.move_to_end(key)
            return got[0]

    def put(self, key: tuple[str, int], rx: Any, size: int) -> None:
        """Keep ``rx`` charged ``size`` bytes, evicting the least recently used past the bound."""
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            while self._entries and self.bytes + size > self.max_bytes:
                _, (_, freed) = self._entries.popitem(last=False)
                self.bytes -= freed
                self.evictions += 1
            self._entries[key] = (rx, size)
            self.bytes += size

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0
