"""The ``agent:`` and ``store:`` sections: loop, listen address, state dir."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, field_validator

from kcops.agent.config.base import Section
from kcops.agent.duration import Duration


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/kcops`` (or ``~/.local/state/kcops``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kcops"


class AgentSection(Section):
    listen: str = Field("127.0.0.1:9464", description="HOST:PORT of the control API and /metrics")
    tick_s: Duration = Field(1.0, ge=0.05, le=60.0, description="seconds between ticks")
    state_dir: Path = Field(
        default_factory=default_state_dir,
        description="guard state, rule state, audit log and the remediation state file",
    )
    token_file: Path | None = Field(
        None, description="file holding the bearer token (else $KCOPS_TOKEN)"
    )
    shutdown_deadline_s: Duration = Field(
        5.0, gt=0, le=120, description="how long a stop waits for components to finish"
    )
    log_level: str = Field(
        "info", pattern="^(debug|info|warning|error)$", description="debug, info, warning or error"
    )

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        host, sep, port = v.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError("must be HOST:PORT with a port in 0..65535, e.g. 127.0.0.1:9464")
        return v

    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class IncidentsSection(Section):
    capture_budget_s: Duration = Field(
        2.0,
        ge=0,
        le=30,
        description="time the evidence of a restart may take before its "
        "signal (stacks, process state, output, series); 0 turns the capture off",
    )
    max_count: int = Field(50, ge=1, le=10_000, description="incident records kept on disk")
    max_bytes: int = Field(
        64 << 20, ge=1 << 20, le=16 << 30, description="bytes of incident records kept on disk"
    )
    series_window_s: Duration = Field(
        600.0, ge=0, le=3600, description="how far back before the capture the series go"
    )


class StoreSection(Section):
    retention_s: Duration = Field(3900.0, ge=60, le=7 * 86400, description="sample retention")
    max_series: int = Field(
        50_000, ge=100, le=5_000_000, description="series the store holds, all sources together"
    )
    max_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        le=64 << 30,
        description="memory budget of the store in bytes (its own estimate): past it the "
        "oldest samples are evicted and new series refused, both counted",
    )
    stale_after_s: Duration = Field(
        30.0, gt=0, description="the exporter hides a series whose newest sample is older"
    )
    max_series_per_source: int = Field(
        20_000, ge=100, le=5_000_000,
        description="series one source may hold (a probe process, the engine scrape, one of "
        "the agent's collectors): past it that source's new series are refused, counted "
        "by source; a source quiet for stale_after_s stops counting against it",
    )  # fmt: skip
