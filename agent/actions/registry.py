"""The registry of built-in actions, filled explicitly.

It is the one list of action names: the rule loader takes the names a ladder
step may use (and each one's parameter model) from :func:`default_registry`.
"""

from __future__ import annotations

from dataclasses import replace

from kcops.agent.actions import (
    evict_cache,
    fallback_to_base,
    lower_topn,
    notify,
    raise_topn,
    restart_worker,
    scale_out,
)
from kcops.agent.actions.base import Check, Params, Registry
from kcops.errors import ActionRejected


def has_scaler(check: Check, _: Params) -> None:
    """scale_out with nothing that acts on its number would report a scale-out that never is."""
    cfg = check.config.actions.scale
    if not (cfg.deployment or cfg.hpa or cfg.hpa_reads_gauge) and cfg.lease.backend == "none":
        raise ActionRejected(
            "scale_out: no scaler configured (set actions.scale.deployment, actions.scale.hpa, "
            "actions.scale.hpa_reads_gauge, or a fleet lease)",
            "not_configured",
        )


def default_registry() -> Registry:
    reg = Registry()
    for spec in (
        evict_cache.SPEC,
        fallback_to_base.SPEC,
        # Undoes a fallback; kcops restores routing itself after the hold time.
        replace(fallback_to_base.RESTORE_SPEC, ladder=False),
        lower_topn.SPEC,
        raise_topn.SPEC,
        restart_worker.SPEC,
        replace(scale_out.SPEC, precheck=has_scaler),
        notify.SPEC,
    ):
        reg.register(spec)
    return reg
