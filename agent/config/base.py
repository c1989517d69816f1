"""Base model for every configuration section: unknown keys are errors.

Booleans are strict (``StrictBool``: only YAML's ``true``/``false``; the loader reads
YAML 1.1's ``yes``/``no``/``on``/``off`` as strings, which a boolean refuses), and a
length of time is :data:`kcops.agent.duration.Duration` (seconds, or a
Prometheus duration string such as ``5m``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict


def _switch(v: object) -> object:
    # `on`/`off` arrive as strings (kcops.agent.yamlload); true/false mean on/off.
    if isinstance(v, bool):
        return "on" if v else "off"
    return v


# A collector switch: auto (on when its source can be known), on or off.
Switch = Annotated[Literal["auto", "on", "off"], BeforeValidator(_switch)]


class Section(BaseModel):
    """A configuration section. ``extra="forbid"`` turns a typo into an error."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
