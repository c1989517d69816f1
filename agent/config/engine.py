"""The ``engine:`` section: where the engine is and how to talk to it."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, StrictBool, field_validator

from kcops.agent.config.base import Section
from kcops.agent.duration import Duration


class CanarySection(Section):
    """``engine.canary``: the synthetic one-token completion (kcops.agent.engine.canary).

    The engine counts it among its own requests (a few prompt tokens, one token out)."""

    enabled: StrictBool = Field(True, description="false turns the canary off")
    interval_s: Duration = Field(
        60.0, gt=0, le=86_400, description="this often while progress is seen (never idle)"
    )
    deadline_s: Duration = Field(
        3.0, gt=0, le=600, description="a run not answered within this is a timeout"
    )
    prompt: str = Field(
        "Hi", min_length=1, max_length=4096, description="the canary completion's prompt"
    )
    model: str | None = Field(None, description="model name sent; none: the first of /v1/models")
    path: str = Field("/v1/completions", description="the OpenAI-compatible completions route")


class EngineSection(Section):
    url: str | None = Field(None, description="engine base URL, e.g. http://127.0.0.1:8000")
    # Checked against the engine kinds where the two meet (kcops.agent.preflight).
    adapter: str = Field(
        "auto",
        pattern=r"^[a-z][a-z0-9_-]{0,31}$",
        description="engine kind (auto: detected from /metrics or its probe route)",
    )
    health_path: str = Field("/health", description="the engine's health route")
    metrics_path: str = Field("/metrics", description="the engine's Prometheus route")
    state_path: str = Field(
        "/admin/state", description="kcops worker state (its pid), read when adapter is kcops"
    )
    timeout_s: Duration = Field(0.5, gt=0, le=30, description="HTTP timeout, shorter than a tick")
    startup_timeout_s: Duration = Field(
        600.0,
        gt=0,
        le=86_400,
        description="a start (agent start or supervised spawn) not ready within this fires "
        "KcopsEngineStartSlow; the engine is 'starting', not down, until then",
    )
    stall_after_s: Duration = Field(
        5.0,
        gt=0,
        le=3600,
        description="work pending and no progress counter or heartbeat moving for this long "
        "(and the canary failed, when enabled) is 'stalled'",
    )
    canary: CanarySection = Field(default_factory=CanarySection)
    pid: int | None = Field(None, ge=1, description="the engine's pid (restart mode signal)")
    pidfile: Path | None = Field(
        None, description="a file holding the engine's pid, read each time"
    )
    log_path: Path | None = Field(
        None, description="engine log searched for its own out-of-memory error when it exits"
    )
    command: list[str] | None = Field(
        None, description="engine command the agent launches and supervises (after `--`)"
    )

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://, e.g. http://127.0.0.1:8000")
        return v.rstrip("/")

    @field_validator("health_path", "metrics_path", "state_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/"):
            raise ValueError("must be a path starting with '/', e.g. /metrics")
        return v
