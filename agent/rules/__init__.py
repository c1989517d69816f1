"""Alert rules: the PromQL-subset evaluator and the alert state machine.

:func:`build` returns the rule-engine components the configuration asks for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext


def build(ctx: AgentContext) -> list[Any]:
    """Rule-engine components (none until the rules issue lands)."""
    return []
