"""A throwaway engine kind, "toyserve", written as a new engine would be: this one file.

It is what a module under ``agent/engine/kinds/`` holds for a real engine: the
metric adapter (its families to canonical ones, and the prefix that identifies
it on a page), the admin routes kcops may call, the probe ``adapter: auto``
asks before ``/metrics`` has told, the program that is this engine on a
supervised command line, and a lifecycle quirk (``--toy-grace N``:
it drains for N seconds by itself on SIGTERM). Registering it is one call,
:meth:`kcops.agent.engine.kinds.EngineRegistry.register` (tests/unit/engine/test_new_kind.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from kcops.agent.engine.kinds import Adapter, EngineKind, EvictRoute, Map, Routes
from kcops.agent.engine.kinds.metrics import COUNTER, GAUGE, HISTOGRAM

GRACE_FLAG = "--toy-grace"


def toy_grace_s(argv: Sequence[str]) -> int | None:
    """N of ``--toy-grace N`` in one command line; None when it does not say."""
    for flag, value in pairwise(argv):
        if flag == GRACE_FLAG and value.isdecimal():
            return int(value)
    return None


KIND = EngineKind(
    adapter=Adapter(
        name="toyserve",
        maps=(
            Map("kcops_request_latency_seconds", HISTOGRAM, ("toyserve_request_ms",), scale=0.001),
            Map("kcops_requests_waiting", GAUGE, ("toyserve_queue_depth",)),
            Map("kcops_requests_running", GAUGE, ("toyserve_active",)),
            Map("kcops_prefix_cache_hits", COUNTER, ("toyserve_cache_hits",)),
        ),
        markers=("toyserve_",),
    ),
    routes=Routes(evict=EvictRoute("/toy/flush"), drain="/toy/admission"),
    probe="/toy/whoami",
    programs=("toyserve",),
    sigterm_drain_s=toy_grace_s,
    summary="a throwaway engine for the registry's end-to-end test",
)
