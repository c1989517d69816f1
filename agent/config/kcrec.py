"""The ``recommendation:`` section: the live K(C) budget recommendation (docs/kc.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, StrictBool, model_validator

from kcops.agent.config.base import Section
from kcops.agent.duration import Duration


class Calibration(Section):
    """A model's calibration: a ``kc sweep --out`` folder (or its recommendation.json), or
    the coverage itself (``p`` and ``quantile``, as the sweep printed them)."""

    file: Path | None = Field(
        None, description="a kc sweep --out folder or its recommendation.json"
    )
    context: int | None = Field(
        None, ge=1, description="which context's recommendation of the file (default the largest)"
    )
    p: float | None = Field(None, gt=0.0, le=1.0, description="attention mass p")
    quantile: float | None = Field(None, gt=0.0, le=1.0, description="call quantile")

    @model_validator(mode="after")
    def _one_source(self) -> Calibration:
        values = self.p is not None or self.quantile is not None
        if self.file is None and not (self.p is not None and self.quantile is not None):
            raise ValueError("give either `file` or both `p` and `quantile`")
        if self.file is not None and values:
            raise ValueError("give either `file` or `p` and `quantile`, not both")
        return self


class RecommendationSection(Section):
    enabled: StrictBool = Field(True, description="compute the live recommendation")
    interval_s: Duration = Field(
        600.0, ge=1.0, le=86_400.0, description="how often the recommendation is recomputed"
    )
    window_s: Duration = Field(
        3600.0, ge=60.0, le=7 * 86_400.0,
        description="the K(C) histograms' window; at most store.retention_s less 5 minutes",
    )  # fmt: skip
    quantile: float = Field(
        0.95,
        gt=0.0,
        le=1.0,
        description="share of attention calls the budget covers (uncalibrated)",
    )
    p: float | None = Field(
        None, gt=0.0, le=1.0,
        description="the attention mass p the budget holds; default: what the probes "
        "measure (their KCOPS_PROBE_P's first value, sent with every frame). Set, it must "
        "be what they measure, or the recommendation is refused",
    )  # fmt: skip
    min_samples: int = Field(
        200, ge=1, le=10_000_000, description="K(C) observations a layer needs in the window"
    )
    uniform_over: Literal["auto", "all", "non_dense"] = Field(
        "auto",
        description="layers the uniform N covers: auto = the non-dense ones when the engine "
        "reports dense layers, else all",
    )
    model: str | None = Field(
        None, description="the served model's name (default: what the engine reports)"
    )
    calibration: dict[str, Calibration] = Field(
        default_factory=dict, description="per model name: its kc sweep calibration"
    )
