"""The ``engine:`` section: where the engine is and how to talk to it."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from kcops.agent.config.base import Section

Adapter = Literal["auto", "vllm", "sglang", "tgi", "triton", "kcops"]


class EngineSection(Section):
    url: str | None = Field(None, description="engine base URL, e.g. http://127.0.0.1:8000")
    adapter: Adapter = "auto"
    health_path: str = "/health"
    metrics_path: str = "/metrics"
    timeout_s: float = Field(0.5, gt=0, le=30, description="HTTP timeout, shorter than a tick")
    pid: int | None = Field(None, ge=1)
    pidfile: Path | None = None
    command: list[str] | None = Field(
        None, description="engine command the agent launches and supervises (after `--`)"
    )
