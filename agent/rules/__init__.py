"""Alerting and recording rules: load, evaluate through :mod:`kcops.agent.promql`, alert.

:func:`build` returns the rule-engine components the configuration asks for.
Modules: ``loader``/``rulefile`` (rule files, params, remediation ladders);
``templates``/``templatebound`` (annotation templating); ``alerting`` (pure
state machine); ``engine`` (rules over a store); ``group``, ``forstate``,
``inhibit``, ``component``; ``promtest`` (promtool test files, replay); ``export``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext
    from kcops.agent.rules.component import RulesComponent
    from kcops.agent.rules.loader import RuleSet


def build(ctx: AgentContext, ruleset: RuleSet | None = None) -> list[RulesComponent]:
    """The rules component; none when disabled. ``ruleset``: the one
    :func:`kcops.agent.preflight.preflight` loaded, its ladder steps checked against the
    actions; else it is read here (steps checked for shape only). Raises
    :class:`~kcops.errors.ConfigError` (exit 2) when the rule file is bad."""
    from kcops.agent.rules.component import RulesComponent
    from kcops.agent.rules.loader import ruleset_from_config

    if not ctx.config.rules.enabled:
        return []
    return [RulesComponent(ctx, ruleset or ruleset_from_config(ctx.config))]
