"""The registry of built-in actions, filled explicitly."""

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
from kcops.agent.actions.prechecks import kube_token
from kcops.errors import ActionRejected


def has_scaler(check: Check, _: Params) -> None:
    """scale_out with nothing that acts on its number would report a scale-out that never is;
    one that would call the Kubernetes API needs the service account token there."""
    cfg = check.config.actions.scale
    if not (cfg.deployment or cfg.hpa or cfg.hpa_reads_gauge) and cfg.lease.backend == "none":
        raise ActionRejected(
            "scale_out: no scaler configured (set actions.scale.deployment, actions.scale.hpa, "
            "actions.scale.hpa_reads_gauge, or a fleet lease)",
            "not_configured",
        )
    alone_patches = cfg.lease.backend == "none" and cfg.deployment and not cfg.hpa
    if cfg.lease.backend == "kubernetes" or alone_patches:
        kube_token(check, "scale_out")


def default_registry() -> Registry:
    reg = Registry()
    for spec in (
        evict_cache.SPEC,
        fallback_to_base.SPEC,
        fallback_to_base.RESTORE_SPEC,
        lower_topn.SPEC,
        raise_topn.SPEC,
        restart_worker.SPEC,
        replace(scale_out.SPEC, precheck=has_scaler),
        notify.SPEC,
    ):
        reg.register(spec)
    return reg
