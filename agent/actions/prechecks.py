"""Prechecks shared by several actions: refusals known before acting, decided alike in
dry-run and enforce (they run before any guard, so a refusal spends nothing).

A precheck looks at configuration and at local facts that cost nothing to read
(a file's existence); what needs the engine is an action's ``look``
(:class:`~kcops.agent.actions.base.ActionSpec`).
"""

from __future__ import annotations

from kcops.agent.actions.base import Check
from kcops.agent.actions.outcome import Refusal
from kcops.errors import ActionRejected


def kube_token(check: Check, what: str) -> None:
    """Refuse (``not_configured``) when the Kubernetes service account token file is
    missing: every API call would be refused for it (kube.py reads the file itself)."""
    path = check.config.actions.kubernetes.token_file
    if not path.is_file():
        raise ActionRejected(
            f"{what}: no Kubernetes service account token at {path} (mount the service "
            "account token, or set actions.kubernetes.token_file)",
            Refusal.NOT_CONFIGURED,
        )
