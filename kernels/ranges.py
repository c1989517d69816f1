"""NVTX ranges per attention layer: the ``nvtx`` package, else ``torch.cuda.nvtx``, else none.

The ``nvtx`` package works without a GPU and costs well under a microsecond
per range with pre-built attributes; ``torch.cuda.nvtx`` needs a CUDA build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

DOMAIN = "kcops"


class Ranges:
    """``push(name)`` / ``pop()``; names are turned into NVTX attributes once and cached."""

    def __init__(self, enabled: bool = True) -> None:
        self.backend = "none"
        self._attrs: dict[str, object] = {}
        self._push: Callable[[Any], object] | None = None  # an NVTX attribute or a str
        self._pop: Callable[[], object] | None = None
        self._make: Callable[[str], object] = lambda name: name
        if not enabled:
            return
        try:
            import nvtx

            domain = nvtx.get_domain(DOMAIN)
            self._make = lambda name: domain.get_event_attributes(message=name)
            self._push, self._pop = domain.push_range, domain.pop_range
            self.backend = "nvtx"
            return
        except Exception:  # not installed, or no NVTX library: try torch
            pass
        try:
            import torch

            if torch.cuda.is_available():
                self._push, self._pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
                self.backend = "torch.cuda.nvtx"
        except Exception:
            pass

    @property
    def active(self) -> bool:
        return self._push is not None

    def push(self, name: str) -> None:
        if self._push is None:
            return
        attrs = self._attrs.get(name)
        if attrs is None:
            attrs = self._attrs[name] = self._make(name)
        self._push(attrs)

    def pop(self) -> None:
        if self._pop is not None:
            self._pop()
