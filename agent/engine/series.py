"""The engine's own series in the agent's store, as actions report them (before/after)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kcops.agent.store import Store

Combine = Callable[[list[float]], float]

# Canonical name -> how to combine the engine's series (one per model/engine index).
CACHE_SERIES: dict[str, Combine] = {
    "kcops_kv_cache_usage_ratio": max,
    "kcops_prefix_cache_hits_total": sum,
    "kcops_prefix_cache_queries_total": sum,
    "kcops_requests_running": sum,
}


def read(
    store: Store, adapter: str | None, names: Mapping[str, Combine] = CACHE_SERIES
) -> dict[str, float | None]:
    """Latest value of each series of engine ``adapter``, combined; absent ones left out.

    ``t`` is the newest sample's timestamp (None when nothing was found).
    """
    out: dict[str, float | None] = {}
    newest: float | None = None
    for name, combine in names.items():
        vals = []
        for key in store.keys(name):
            labels = key.label_dict()
            if adapter is not None and labels.get("engine") != adapter:
                continue
            got = store.latest(key)
            if got is not None:
                vals.append(got[1])
                newest = got[0] if newest is None else max(newest, got[0])
        if vals:
            out[name.removeprefix("kcops_")] = float(combine(vals))
    out["t"] = newest
    return out


async def after(
    store: Store, adapter: str | None, since: float, timeout_s: float
) -> dict[str, float | None]:
    """The series once a scrape newer than ``since`` landed (or what there is at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        snap = read(store, adapter)
        t = snap.get("t")
        if (t is not None and t > since) or time.monotonic() >= deadline:
            return snap
        await asyncio.sleep(0.1)
