"""Base model for every configuration section: unknown keys are errors.

Booleans are strict (``StrictBool``: ``"false"`` or ``"yes"`` quoted is refused,
YAML's unquoted ``true``/``false``/``on``/``off`` are booleans already), and a
length of time is :data:`kcops.agent.duration.Duration` (seconds, or a
Prometheus duration string such as ``5m``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _switch(v: object) -> object:
    # YAML 1.1 reads unquoted `on` and `off` as booleans: take them as meant.
    if isinstance(v, bool):
        return "on" if v else "off"
    return v


# A collector switch: auto (on when its source can be known), on or off.
Switch = Annotated[Literal["auto", "on", "off"], BeforeValidator(_switch)]


class Section(BaseModel):
    """A configuration section. ``extra="forbid"`` turns a typo into an error."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
