"""The ``rules:`` section: the alert table and its parameters."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, StrictBool

from kcops.agent.config.base import Section
from kcops.agent.rules.rulefile import ParamValue


class RulesSection(Section):
    file: Path | None = Field(None, description="rule file; none = the packaged alerts/rules.yaml")
    enabled: StrictBool = True
    params: dict[str, ParamValue] = Field(
        default_factory=dict,
        description=(
            "overrides of the rule file's params (thresholds, windows), e.g. "
            "{p99_ttft_seconds: 0.3}; a finite number or a string; an unknown name is "
            "refused at load"
        ),
    )
