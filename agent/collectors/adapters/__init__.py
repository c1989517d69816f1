"""Engine metrics adapters: one file per engine, each a table of :class:`Map` rows.

:func:`get` returns an adapter by name; :func:`detect` picks one from the
family names on an exposition page (``kcops`` before ``vllm``, since the
reference worker speaks vLLM's names too).
"""

from __future__ import annotations

from collections.abc import Iterable

from kcops.agent.collectors.adapters import kcops, sglang, tgi, triton, vllm
from kcops.agent.collectors.adapters.base import Adapter, Map

__all__ = ["ADAPTERS", "Adapter", "Map", "detect", "get"]

# Detection order matters: the kcops worker also exposes vllm:* names.
ADAPTERS: dict[str, Adapter] = {
    a.name: a for a in (kcops.ADAPTER, vllm.ADAPTER, sglang.ADAPTER, tgi.ADAPTER, triton.ADAPTER)
}


def get(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise ValueError(
            f"unknown engine adapter {name!r}; allowed: {', '.join(ADAPTERS)}"
        ) from None


def detect(names: Iterable[str]) -> Adapter | None:
    """The adapter whose marker prefixes appear among ``names``, or None."""
    names = list(names)
    for a in ADAPTERS.values():
        if a.detects(names):
            return a
    return None
