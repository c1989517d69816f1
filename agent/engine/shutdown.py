"""How long an engine drains by itself after SIGTERM, read from its command lines.

Some engines drain in-flight requests on SIGTERM for a time their command line
sets (vLLM's ``--shutdown-timeout N``: :mod:`kcops.agent.engine.kinds.vllm` says
how). Whoever sends SIGTERM must wait more than that before its SIGKILL: the
supervisor's and ``restart_worker``'s grace is ``actions.restart.grace_s``
(the teardown) *plus* ``N`` (:func:`engine_drain_s`). Each engine kind reads
its own flag (``EngineKind.sigterm_drain_s``); the registry asks them all,
since a wrapper script may run any engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kcops.agent.engine import proctree
from kcops.agent.engine.kinds import EngineRegistry, builtin_kinds


def engine_drain_s(
    command: Sequence[str] | None,
    pgid: int | None,
    proc_root: Path = proctree.PROC,
    registry: EngineRegistry | None = None,
) -> int:
    """Seconds the engine drains by itself after SIGTERM (0 when it does not say).

    Read from ``command`` (what the supervisor ran) and from the command line of
    every live member of process group ``pgid``: a wrapper script's child that is
    ``vllm serve … --shutdown-timeout 30`` counts too.
    """
    reg = registry or builtin_kinds()
    argvs: list[Sequence[str]] = [command] if command else []
    if pgid is not None:
        argvs += [proctree.cmdline(p, proc_root) for p in proctree.group_pids(pgid, proc_root)]
    found = [n for n in (reg.sigterm_drain_s(a) for a in argvs) if n is not None]
    return max(found) if found else 0
