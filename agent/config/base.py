"""Base model for every configuration section: unknown keys are errors."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A configuration section. ``extra="forbid"`` turns a typo into an error."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
