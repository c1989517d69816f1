"""Collectors: one file each, all behind :class:`~kcops.agent.collectors.base.Collector`.

:func:`build` is the one place that decides, from the configuration, which
collectors the agent runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcops.agent.collectors.base import Collector, CollectorRunner
from kcops.agent.collectors.selfmetrics import SelfCollector, TickHistogram

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext

__all__ = ["Collector", "CollectorRunner", "SelfCollector", "TickHistogram", "build"]


def build(ctx: AgentContext, ticks: TickHistogram) -> list[Collector]:
    """The collectors the configuration asks for, in the order they run."""
    cfg = ctx.config.collectors
    out: list[Collector] = []
    if cfg.self_metrics:
        out.append(SelfCollector(ticks))
    return out
