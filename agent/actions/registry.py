"""The registry of built-in actions, filled explicitly."""

from __future__ import annotations

from kcops.agent.actions import (
    evict_cache,
    fallback_to_base,
    lower_topn,
    notify,
    raise_topn,
    restart_worker,
    scale_out,
)
from kcops.agent.actions.base import Registry


def default_registry() -> Registry:
    reg = Registry()
    for spec in (
        evict_cache.SPEC,
        fallback_to_base.SPEC,
        fallback_to_base.RESTORE_SPEC,
        lower_topn.SPEC,
        raise_topn.SPEC,
        restart_worker.SPEC,
        scale_out.SPEC,
        notify.SPEC,
    ):
        reg.register(spec)
    return reg
