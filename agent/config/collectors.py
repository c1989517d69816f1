"""The ``collectors:`` section: which collectors run and their knobs."""

from __future__ import annotations

from pydantic import Field

from kcops.agent.config.base import Section


class CollectorsSection(Section):
    self_metrics: bool = Field(True, description="the agent's own RSS, CPU and tick time")
