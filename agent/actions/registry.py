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
    lower_topn,
    notify,
    raise_topn,
    restart_worker,
    scale_out,
)
from kcops.agent.actions.base import Check, Params, Registry
from kcops.agent.actions.outcome import ActionName, Refusal
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
            Refusal.NOT_CONFIGURED,
        )
    # Refusals scale_out itself would only find while acting (kept there too): known from
    # the configuration alone, so a dry run must say them as well.
    lease = cfg.lease
    if cfg.hpa and lease.backend == "none":
        raise ActionRejected(
            f"actions.scale.hpa {cfg.hpa} is set but actions.scale.lease.backend is none: "
            "raising an HPA's floor is a fleet action and needs the lease",
            Refusal.UNSUPPORTED,
        )
    if lease.backend == "kubernetes" and not cfg.hpa:
        raise ActionRejected(
            "actions.scale.lease.backend is kubernetes but actions.scale.hpa is not set",
            Refusal.UNSUPPORTED,
        )
    if lease.backend == "redis" and not (lease.redis_url or check.config.actions.evict.redis_url):
        raise ActionRejected(
            "actions.scale.lease.backend is redis but neither lease.redis_url nor "
            "actions.evict.redis_url is set",
            Refusal.UNSUPPORTED,
        )
    if lease.backend == "kubernetes" or (lease.backend == "none" and cfg.deployment):
        kube_token(check, ActionName.SCALE_OUT)


def builtin_actions() -> Registry:
    reg = Registry()
    for spec in (
        evict_cache.SPEC,
        fallback_to_base.SPEC,
        # Undoes a fallback; kcops restores routing itself after the hold time.
        replace(fallback_to_base.RESTORE_SPEC, ladder=False),
        lower_topn.SPEC,
        raise_topn.SPEC,
        restart_worker.SPEC,
        evict_pod.SPEC,
        replace(scale_out.SPEC, precheck=has_scaler),
        notify.SPEC,
    ):
        reg.register(spec)
    return reg
