"""What each engine can be asked to do, as data (issue 10 item 2).

One row per adapter name. Every action asks the engine object, which answers
from this table, before any guard runs: a capability the engine lacks is a
refusal with a reason ("vllm has no route control"), never a silent widening
(a partial eviction never becomes a full reset).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

EVICT_POLICIES = ("expired", "lru", "all")


@dataclass(frozen=True)
class Capabilities:
    """What one engine supports. ``evict`` lists the eviction policies it can do."""

    evict: frozenset[str] = frozenset()
    drain: bool = False  # stop admitting new requests, report in-flight ones
    pause: bool = False  # pause and resume generation (vLLM dev mode)
    route: bool = False  # switch to the base model (fallback) and back
    topn: bool = False  # change the attention budget N
    state: bool = False  # an admin state document (pid, top_n, in_flight)
    drop_running: bool = False  # an eviction may preempt running requests, when asked

    def with_pause(self, on: bool) -> Capabilities:
        return replace(self, pause=on)


NOTHING = Capabilities()

TABLE: dict[str, Capabilities] = {
    # The reference worker has the whole admin API.
    "kcops": Capabilities(
        evict=frozenset(EVICT_POLICIES), drain=True, route=True, topn=True, state=True
    ),
    # POST /reset_prefix_cache resets everything (optionally the running
    # requests' blocks too); /pause and /resume exist only with
    # VLLM_SERVER_DEV_MODE=1, probed once at resolve time.
    "vllm": Capabilities(evict=frozenset({"all"}), drop_running=True),
    "sglang": Capabilities(evict=frozenset({"all"})),
    "tgi": NOTHING,
    "triton": NOTHING,
}

# How each lacking capability reads in a refusal: "<engine> has no <what>".
WHAT = {
    "drain": "drain control",
    "pause": "pause control",
    "route": "route control",
    "topn": "top-N control",
    "state": "admin state",
    "evict": "cache eviction",
}


def of(adapter: str) -> Capabilities:
    return TABLE.get(adapter, NOTHING)
