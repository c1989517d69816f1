"""The ``exporters:`` section: OpenTelemetry."""

from __future__ import annotations

from pydantic import Field, StrictBool

from kcops.agent.config.base import Section
from kcops.agent.duration import Duration


class OtlpSection(Section):
    endpoint: str | None = Field(
        None, description="OTLP/HTTP base URL, e.g. http://127.0.0.1:4318; none = no export"
    )
    service_name: str = Field("kcops-agent", description="OTel service.name of the agent")
    timeout_s: Duration = Field(5.0, gt=0, le=60, description="one export's timeout")
    metrics: StrictBool = Field(True, description="also push the agent's series as OTLP metrics")
    metrics_interval_s: Duration = Field(
        15.0, ge=0.05, le=3600, description="seconds between two OTLP metric exports"
    )


class ExportersSection(Section):
    otlp: OtlpSection = Field(default_factory=OtlpSection)
