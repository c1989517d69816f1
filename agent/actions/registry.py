"""The registry of built-in actions, filled explicitly.

It is the one list of action names: the rule loader is handed the names a ladder
step may use (and each one's parameter model) from :func:`builtin_actions`.
"""

from __future__ import annotations

from dataclasses import replace

from kcops.agent.actions import (
    evict_cache,
    evict_pod,
    fallback_to_base,
    notify,
    restart_worker,
    scale_out,
    topn,
)
from kcops.agent.actions.base import Registry


def builtin_actions() -> Registry:
    reg = Registry()
    for spec in (
        evict_cache.SPEC,
        fallback_to_base.SPEC,
        # Undoes a fallback; kcops restores routing itself after the hold time.
        replace(fallback_to_base.RESTORE_SPEC, ladder=False),
        topn.LOWER_SPEC,
        topn.RAISE_SPEC,
        restart_worker.SPEC,
        evict_pod.SPEC,
        scale_out.SPEC,
        notify.SPEC,
    ):
        reg.register(spec)
    return reg
