"""How long an engine drains by itself after SIGTERM: vLLM's ``--shutdown-timeout N``.

vLLM 0.32 (``vllm/v1/engine/core.py``, ``_handle_shutdown``): on SIGTERM the
engine core stops admitting (new requests are answered as aborted) and then

- ``N == 0`` (the default): aborts every request in flight at once;
- ``N > 0``: keeps stepping until the requests in flight are done, for at most
  ``N`` seconds; the process manager then kills what is left
  (``vllm/v1/utils.py``: ``shutdown``) and the API server exits.

So without ``/pause`` (dev mode) a restart loses nothing only with ``N > 0``,
and only if whoever sends SIGTERM waits more than ``N`` seconds before its
SIGKILL: the supervisor's and ``restart_worker``'s grace is
``actions.restart.grace_s`` (the teardown) *plus* ``N``, read from the engine's
command line (:func:`engine_drain_s`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from kcops.agent.engine import proctree

FLAG = "--shutdown-timeout"
# vLLM's own bound on the flag is an int >= 0; a day is far past any sane drain.
MAX_S = 86_400


def shutdown_timeout_s(argv: Sequence[str]) -> int | None:
    """``N`` of ``--shutdown-timeout N`` (or ``=N``) in one argv; None when absent or not
    a whole number in [0, 86400] (vLLM itself refuses to start with such a value)."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(FLAG + "="):
            value = arg[len(FLAG) + 1 :]
    if value is None or not value.isdecimal():
        return None
    n = int(value)
    return n if n <= MAX_S else None


def largest_timeout(argvs: Iterable[Sequence[str]]) -> int | None:
    """The largest ``N`` among several command lines (a wrapper and the engine it runs)."""
    found = [n for n in (shutdown_timeout_s(a) for a in argvs) if n is not None]
    return max(found) if found else None


def engine_drain_s(
    command: Sequence[str] | None, pgid: int | None, proc_root: Path = proctree.PROC
) -> int:
    """Seconds the engine drains by itself after SIGTERM (0 when it does not say).

    Read from ``command`` (what the supervisor ran) and from the command line of
    every live member of process group ``pgid``: a wrapper script's child that is
    ``vllm serve … --shutdown-timeout 30`` counts too.
    """
    argvs: list[Sequence[str]] = [command] if command else []
    if pgid is not None:
        argvs += [proctree.cmdline(p, proc_root) for p in proctree.group_pids(pgid, proc_root)]
    return largest_timeout(argvs) or 0
