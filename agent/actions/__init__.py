"""Remediation: guarded actions, escalation ladders, audit.

:func:`build` returns the remediation components the configuration asks for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext


def build(ctx: AgentContext) -> list[Any]:
    """Remediation components (none until the remediation issue lands)."""
    return []
