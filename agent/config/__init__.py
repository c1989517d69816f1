"""Configuration: one YAML file, validated into typed models on load.

Each section lives in its own module. A bad file is refused with
:class:`~kcops.errors.ConfigError` naming the field path, the bad value
and what is allowed; unknown keys are errors.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, ValidationError

from kcops.agent.config.actions import ActionsSection
from kcops.agent.config.agent import AgentSection, IncidentsSection, StoreSection
from kcops.agent.config.base import Section
from kcops.agent.config.collectors import CollectorsSection
from kcops.agent.config.cost import CostSection
from kcops.agent.config.engine import EngineSection
from kcops.agent.config.exporters import ExportersSection
from kcops.agent.config.kcrec import RecommendationSection
from kcops.agent.config.rules import RulesSection
from kcops.agent.validation import one_line
from kcops.agent.yamlload import load_yaml_file
from kcops.errors import ConfigError

__all__ = ["Config", "format_validation_error", "load_config", "parse_config"]


class Config(Section):
    agent: AgentSection = Field(default_factory=AgentSection)
    store: StoreSection = Field(default_factory=StoreSection)
    engine: EngineSection = Field(default_factory=EngineSection)
    collectors: CollectorsSection = Field(default_factory=CollectorsSection)
    rules: RulesSection = Field(default_factory=RulesSection)
    actions: ActionsSection = Field(default_factory=ActionsSection)
    exporters: ExportersSection = Field(default_factory=ExportersSection)
    cost: CostSection = Field(default_factory=CostSection)
    recommendation: RecommendationSection = Field(default_factory=RecommendationSection)
    incidents: IncidentsSection = Field(default_factory=IncidentsSection)


def format_validation_error(exc: ValidationError, source: str) -> str:
    """One line: ``source: field.path: message (allowed: ...); got 'excerpt'``, and how
    many other problems the file has."""
    return one_line(exc, source, Config)


def parse_config(data: object, source: str = "<config>") -> Config:
    """Validate a mapping (as loaded from YAML) into a :class:`Config`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source)) from None


def load_config(path: Path | str | None) -> Config:
    """Load and validate a YAML file; None gives the defaults."""
    if path is None:
        return Config()
    p = Path(path)
    return parse_config(load_yaml_file(p), str(p))
