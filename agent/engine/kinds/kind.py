"""What an engine kind is: everything kcops knows about one engine, as data.

An :class:`EngineKind` holds its metric adapter, its admin routes, how
``adapter: auto`` recognises it before its ``/metrics`` has been read (the
supervised command line, or one ``GET`` that answers 200 only on this engine)
and how long it drains by itself after SIGTERM. One module per kind under
:mod:`kcops.agent.engine.kinds` builds one; the registry is where the agent finds them.

What an engine can be asked to do (:class:`Capabilities`) follows from its
routes: a route it lacks is a refusal with a reason, never a silent widening
(a partial eviction never becomes a full reset). Only pausing is learnt at run
time (vLLM serves ``/pause`` in dev mode only), by the pause route's probe.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from kcops.agent.engine.kinds.metrics import Adapter

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

# How each lacking capability reads in a refusal: "<engine> has no <what>".
WHAT = {
    "drain": "drain control",
    "pause": "pause control",
    "route": "route control",
    "topn": "top-N control",
    "state": "admin state",
    "evict": "cache eviction",
}


@dataclass(frozen=True)
class EvictRoute:
    """``POST path``: how the engine drops cached blocks.

    ``policy_body``: the engine takes ``{"policy", "fraction"}`` and answers with
    its own report (the kcops worker); otherwise the route resets the whole
    cache and an answer ``{"success": false}`` means it did not.
    ``drop_running_param``: a query flag that also frees running requests' blocks.
    """

    path: str
    policies: frozenset[str] = frozenset({"all"})
    policy_body: bool = False
    drop_running_param: str | None = None


@dataclass(frozen=True)
class PauseRoutes:
    """Pause (answers once running requests are done: the drain itself) and resume.

    ``probe`` answers 200 only where pausing is served; it is asked once.
    """

    pause: str
    resume: str
    probe: str
    pause_params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Routes:
    """The engine's admin routes; None where it has none."""

    evict: EvictRoute | None = None
    route: str | None = None  # POST {"mode": "base" | "sparse"}
    topn: str | None = None  # POST {"top_n": N}
    drain: str | None = None  # POST {"admit": bool}
    state: str | None = None  # GET: {"pid", "top_n", "in_flight", ...}
    pause: PauseRoutes | None = None


def _python_module(argv: Sequence[str]) -> str | None:
    """M of ``python [options] -m M …``: only among the interpreter's own options."""
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else None
        if not arg.startswith("-"):
            return None
    return None


# argv -> seconds the engine drains by itself after SIGTERM, None when that argv does not say.
SigtermDrain = Callable[[Sequence[str]], int | None]


@dataclass(frozen=True)
class EngineKind:
    """One engine kind. ``adapter.name`` is its name (``engine.adapter``, label ``engine``)."""

    adapter: Adapter
    routes: Routes = field(default_factory=Routes)
    # GET path that answers 200 on this engine: adapter auto, before /metrics told.
    probe: str | None = None
    # Programs that are this engine on a command line the agent supervises (`-- CMD`):
    # an executable's base name, or a module run by `python -m` (or a submodule of it).
    programs: tuple[str, ...] = ()
    sigterm_drain_s: SigtermDrain | None = None
    summary: str = ""

    @property
    def name(self) -> str:
        return self.adapter.name

    def runs_in(self, argv: Sequence[str]) -> bool:
        """True when ``argv`` starts one of this kind's programs (detection by command line)."""
        if not argv or not self.programs:
            return False
        if argv[0].rsplit("/", 1)[-1] in self.programs:
            return True
        module = _python_module(argv)
        return module is not None and any(
            module == p or module.startswith(p + ".") for p in self.programs
        )

    @property
    def capabilities(self) -> Capabilities:
        """What its routes allow (pause off: the pause probe turns it on)."""
        r = self.routes
        return Capabilities(
            evict=r.evict.policies if r.evict is not None else frozenset(),
            drain=r.drain is not None,
            route=r.route is not None,
            topn=r.topn is not None,
            state=r.state is not None,
            drop_running=r.evict is not None and r.evict.drop_running_param is not None,
        )
