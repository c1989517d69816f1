"""The ``collectors:`` section: which collectors run and their knobs.

Defaults follow the issue: the probe receiver and NVML are on (NVML reports
itself unavailable without a driver), the process, CPU device memory, engine
scrape and health collectors run when the configuration says where the engine
is (``engine.url``, ``engine.pid``, ``engine.pidfile`` or ``engine.command``).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, StrictBool

from kcops.agent.config.base import Section, Switch
from kcops.agent.duration import Duration


class ProbeSection(Section):
    enabled: StrictBool = Field(True, description="listen for the in-engine probe's frames")
    socket_path: Path | None = Field(
        None,
        description="the stream socket probes connect to; "
        "default kcops.kernels.wire.default_socket_path()",
    )
    max_processes: int = Field(
        32, ge=1, le=1024, description="distinct engine processes tracked (label `process`)"
    )
    max_layers: int = Field(
        512, ge=1, le=4096, description="distinct `layer` label values of attention call counts"
    )
    max_kc_layers: int = Field(
        128, ge=1, le=4096,
        description="distinct `layer` values of kcops_kc_tokens per process (30 series each)",
    )  # fmt: skip
    max_frames_per_s: int = Field(
        2000, ge=10, le=1_000_000, description="frames decoded per second; more are shed (counted)"
    )
    max_receive_ms_per_s: int = Field(
        250, ge=10, le=1000,
        description="loop time spent receiving per second; past it reading pauses (counted)",
    )  # fmt: skip
    max_connections: int = Field(
        256, ge=1, le=65_536,
        description="probe stream connections kept; past it a new one takes the place of "
        "the least active (one that never sent a whole frame first), or is refused",
    )  # fmt: skip
    connection_idle_timeout_s: Duration = Field(
        60.0, ge=1.0, le=86_400.0,
        description="a probe connection that sends nothing this long is closed (counted; "
        "the probe reconnects with its next frame)",
    )  # fmt: skip
    partial_frame_timeout_s: Duration = Field(
        10.0, ge=0.1, le=3600.0,
        description="a frame begun and not finished within this is dropped and its "
        "connection closed (counted); keep it above the probe's flush interval",
    )  # fmt: skip


class NvmlSection(Section):
    enabled: Switch = Field(
        "auto", description="auto/on: read NVML (reports 'unavailable' without a driver); off"
    )
    process_interval_s: Duration = Field(
        10.0, ge=1.0, le=3600.0, description="how often to read per-process GPU memory (slow call)"
    )
    max_events_per_tick: int = Field(
        64, ge=1, le=10_000, description="XID events drained per tick, without waiting"
    )


class ProcessSection(Section):
    enabled: Switch = Field("auto", description="auto: on when an engine pid can be known")
    log_tail_bytes: int = Field(
        65_536, ge=0, le=16 << 20, description="bytes of engine.log_path searched for an OOM error"
    )


class DeviceMemorySection(Section):
    """Device memory for a CPU engine: process tree RSS against its limit."""

    enabled: Switch = Field("auto", description="auto: on when an engine pid can be known")
    limit_bytes: int | None = Field(
        None, ge=1, description="limit when the engine's cgroup sets none (else host total)"
    )


class ScrapeSection(Section):
    enabled: Switch = Field("auto", description="auto: on when engine.url is set")
    max_body_bytes: int = Field(
        8 << 20, ge=1024, le=256 << 20, description="an exposition larger than this is refused"
    )


class HealthSection(Section):
    enabled: Switch = Field("auto", description="auto: on when engine.url is set")


class CollectorsSection(Section):
    self_metrics: StrictBool = Field(True, description="the agent's own RSS, CPU and tick time")
    probe: ProbeSection = Field(default_factory=ProbeSection)
    nvml: NvmlSection = Field(default_factory=NvmlSection)
    process: ProcessSection = Field(default_factory=ProcessSection)
    device_memory: DeviceMemorySection = Field(default_factory=DeviceMemorySection)
    scrape: ScrapeSection = Field(default_factory=ScrapeSection)
    health: HealthSection = Field(default_factory=HealthSection)
