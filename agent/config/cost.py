"""The ``cost:`` section: what a model's context costs (kcops.agent.cost, ``kcops cost``)."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from kcops.agent.config.base import Section


class PriceSection(Section):
    """One model's price: per 1,000 tokens of context, or per device-hour with the context
    tokens one device-hour serves (a throughput you measured: the conversion is yours)."""

    per_1k_context_tokens: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="price of 1,000 context tokens"
    )
    per_device_hour: float | None = Field(
        None, ge=0, allow_inf_nan=False, description="or: a device hour's price ..."
    )
    context_tokens_per_device_hour: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="... and the context tokens it serves"
    )

    @model_validator(mode="after")
    def _one_way(self) -> PriceSection:
        hourly = self.per_device_hour is not None or self.context_tokens_per_device_hour is not None
        if (self.per_1k_context_tokens is None) == (not hourly):
            raise ValueError(
                "give per_1k_context_tokens, or per_device_hour with "
                "context_tokens_per_device_hour (not both)"
            )
        if hourly and (self.per_device_hour is None or self.context_tokens_per_device_hour is None):
            raise ValueError("per_device_hour needs context_tokens_per_device_hour, and back")
        return self

    def per_1k(self) -> float:
        """The price of 1,000 context tokens."""
        if self.per_1k_context_tokens is not None:
            return self.per_1k_context_tokens
        assert self.per_device_hour is not None and self.context_tokens_per_device_hour
        return self.per_device_hour * 1000.0 / self.context_tokens_per_device_hour


class CostSection(Section):
    prices: dict[str, PriceSection] = Field(
        default_factory=dict,
        description="by model name (the engine's model label); '*' prices any other model",
    )

    def per_1k(self) -> dict[str, float]:
        out = {model: p.per_1k() for model, p in self.prices.items()}
        assert all(math.isfinite(v) for v in out.values())
        return out
