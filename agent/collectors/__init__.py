"""Collectors: one file each, all behind :class:`~kcops.agent.collectors.base.Collector`.

:func:`build` is the one place that decides, from the configuration, which
collectors the agent runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcops.agent.collectors.base import Collector, CollectorRunner, InThread
from kcops.agent.collectors.selfmetrics import RegexCacheStats, SelfCollector, tick_histogram

if TYPE_CHECKING:
    from kcops.agent.collectors.procwatch import EngineWatch
    from kcops.agent.component import AgentContext
    from kcops.agent.config import Config
    from kcops.agent.engine import Engine
    from kcops.agent.engine.pid import EnginePid
    from kcops.histogram import Histogram

__all__ = ["Collector", "CollectorRunner", "SelfCollector", "build", "tick_histogram"]


def _on(switch: str, auto: bool) -> bool:
    return switch == "on" or (switch == "auto" and auto)


def build(
    ctx: AgentContext,
    ticks: Histogram,
    engine: Engine | None = None,
    pids: EnginePid | None = None,
    regex_cache: RegexCacheStats | None = None,
) -> list[Collector]:
    """The collectors the configuration asks for, in the order they run.

    ``engine`` (the one engine object) learns its adapter from the scrape and
    its lifecycle from the health checks; ``pids`` is the one engine pid
    source (the supervisor, built later, sets its ``supervised``); ``regex_cache``: the
    rules' compiled regexes, whose bound the self collector reports.
    """
    from kcops.agent.collectors.procwatch import EngineWatch
    from kcops.agent.engine.pid import EnginePid

    cfg = ctx.config.collectors
    eng = ctx.config.engine
    out: list[Collector] = []
    if cfg.self_metrics:
        out.append(SelfCollector(ticks, store=ctx.store, regex_cache=regex_cache))
    pids = pids or EnginePid(pid=eng.pid, pidfile=eng.pidfile)
    watch = EngineWatch(pids, log_path=eng.log_path, log_tail_bytes=cfg.process.log_tail_bytes)
    # A pid may be known: configured, supervised (`-- CMD`), or read from the
    # kcops worker's /admin/state once the engine at engine.url answers.
    pid_knowable = (
        pids.configured
        or bool(eng.command)
        or (eng.url is not None and _reports_pid(eng.adapter, engine))
    )
    out += _local(ctx, watch, pid_knowable, engine)
    out += _http(ctx, pids, engine)
    return out


def _reports_pid(adapter: str, engine: Engine | None) -> bool:
    """True when the engine kind may report its pid (an admin state route), or may be one."""
    from kcops.agent.engine.kinds import AUTO, builtin_kinds

    if adapter == AUTO:
        return True
    registry = engine.registry if engine is not None else builtin_kinds()
    return registry.get(adapter).routes.state is not None


def _local(
    ctx: AgentContext, watch: EngineWatch, pid_knowable: bool, engine: Engine | None = None
) -> list[Collector]:
    """Probe receiver, NVML, and the engine's process tree."""
    from kcops.agent.collectors.cpumem import CpuDeviceMemoryCollector
    from kcops.agent.collectors.nvml import Nvml, NvmlCollector
    from kcops.agent.collectors.probe import ProbeReceiver
    from kcops.agent.collectors.process import EngineEventsCollector, ProcessCollector

    cfg = ctx.config.collectors
    out: list[Collector] = []
    if cfg.probe.enabled:
        out.append(
            ProbeReceiver(
                cfg.probe.socket_path,
                max_processes=cfg.probe.max_processes,
                max_layers=cfg.probe.max_layers,
                max_kc_layers=cfg.probe.max_kc_layers,
                max_frames_per_s=cfg.probe.max_frames_per_s,
                max_receive_ms_per_s=cfg.probe.max_receive_ms_per_s,
                max_connections=cfg.probe.max_connections,
                connection_idle_timeout_s=cfg.probe.connection_idle_timeout_s,
                partial_frame_timeout_s=cfg.probe.partial_frame_timeout_s,
                series_share=ctx.store.max_series // cfg.probe.max_processes,
                engine_pids=watch.pid_set,  # the engine's process tree (EnginePid): a slot each
                prices=ctx.config.cost.per_1k(),
            )
        )
    if cfg.nvml.enabled != "off":
        # NVML calls can hang in the driver: never on the event loop.
        out.append(
            InThread(
                NvmlCollector(
                    Nvml(),
                    engine_pids=watch.pid_set if pid_knowable else None,
                    process_interval_s=cfg.nvml.process_interval_s,
                    max_events_per_tick=cfg.nvml.max_events_per_tick,
                )
            )
        )
    if _on(cfg.process.enabled, pid_knowable):
        out.append(ProcessCollector(watch))
        out.append(EngineEventsCollector(watch, engine))
    if _on(cfg.device_memory.enabled, pid_knowable):
        out.append(CpuDeviceMemoryCollector(watch, limit_bytes=cfg.device_memory.limit_bytes))
    return out


def check_sources(config: Config) -> None:
    """ConfigError for a collector switched ``on`` whose source the config does not name
    (``kcops.agent.preflight``: ``agent run`` and ``check-config`` alike)."""
    from kcops.errors import ConfigError

    cfg = config.collectors
    for section, what in ((cfg.health, "health"), (cfg.scrape, "scrape")):
        if section.enabled == "on" and config.engine.url is None:
            raise ConfigError(
                f"collectors.{what}.enabled: 'on' needs engine.url (or --engine-url); "
                "allowed without it: auto, off"
            )


def _http(ctx: AgentContext, pids: EnginePid, engine: Engine | None) -> list[Collector]:
    """Health and /metrics of the engine at engine.url, over one shared poll."""
    from kcops.agent.collectors.engine_http import EngineClient
    from kcops.agent.collectors.health import HealthCollector
    from kcops.agent.collectors.scrape import EngineScrapeCollector

    cfg = ctx.config.collectors
    eng = ctx.config.engine
    has_url = eng.url is not None
    check_sources(ctx.config)
    want_health = _on(cfg.health.enabled, has_url)
    want_scrape = _on(cfg.scrape.enabled, has_url)
    if eng.url is None or not (want_health or want_scrape):
        return []
    client = EngineClient(
        eng.url,
        metrics_path=eng.metrics_path,
        health_path=eng.health_path,
        state_path=eng.state_path,
        # Under the runner's own per-collector deadline (0.8 of a tick), so a hung
        # engine reads as "down" (up=0) rather than as a timed-out collector.
        timeout_s=min(eng.timeout_s, 0.7 * ctx.config.agent.tick_s),
        max_body_bytes=cfg.scrape.max_body_bytes,
        pids=pids,
        # One HTTP client for the engine, shared with its admin calls.
        http=engine.http if engine is not None else None,
    )
    # Order: the scrape, then the stall watch (reads the scrape and the probe from the
    # store, judges stalled), then health (steps the lifecycle and exports it).
    out: list[Collector] = []
    if want_scrape:
        prices = ctx.config.cost.per_1k()
        out.append(EngineScrapeCollector(client, eng.adapter, engine, prices=prices))
        if engine is not None:
            out.append(_stall_watch(ctx, engine))
    if want_health:
        out.append(HealthCollector(client, engine))
    return out


def _stall_watch(ctx: AgentContext, engine: Engine) -> Collector:
    from kcops.agent.engine.canary import Canary, CanaryConfig
    from kcops.agent.engine.watch import StallWatch

    eng = ctx.config.engine
    c = eng.canary
    canary = None
    if c.enabled and eng.url is not None:
        cfg = CanaryConfig(True, c.interval_s, c.deadline_s, c.prompt, c.model, c.path)
        canary = Canary(eng.url, engine.http, cfg, engine.headers)
    return StallWatch(
        ctx.store, engine, eng.stall_after_s, canary, lookback_s=3 * ctx.config.agent.tick_s
    )
