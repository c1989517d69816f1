"""NVTX ranges per attention layer: the ``nvtx`` package, else ``torch.cuda.nvtx``, else none.

The ``nvtx`` package works without a GPU and costs well under a microsecond
per range with pre-built attributes; ``torch.cuda.nvtx`` needs a CUDA build.
With no NVTX tool attached to the process (no profiler: ``nvtx`` then hands out
a ``DummyDomain`` whose pushes do nothing) the ranges are off, and the probe
makes no call for them at all.
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
        self.active = False  # whether push records anything (the probe skips both if not)
        if not enabled:
            return
        try:
            import nvtx

            domain = nvtx.get_domain(DOMAIN)
            if isinstance(domain, nvtx._lib.DummyDomain):
                # no NVTX tool attached to this process (tools attach at its start): every
                # push would be a no-op, so none is made
                self.backend = "nvtx (no tool attached: off)"
                return
            self._make = lambda name: domain.get_event_attributes(message=name)
            self._push, self._pop = domain.push_range, domain.pop_range
            self.backend = "nvtx"
            self.active = True
            return
        except Exception:  # not installed, or no NVTX library: try torch
            pass
        try:
            import torch

            if torch.cuda.is_available():
                self._push, self._pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
                self.backend = "torch.cuda.nvtx"
                self.active = True
        except Exception:
            pass

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
