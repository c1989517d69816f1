"""Collectors: one file each, all behind :class:`~kcops.agent.collectors.base.Collector`.

:func:`build` is the one place that decides, from the configuration, which
collectors the agent runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcops.agent.collectors.base import Collector, CollectorRunner, InThread
from kcops.agent.collectors.selfmetrics import SelfCollector, tick_histogram

if TYPE_CHECKING:
    from kcops.agent.component import AgentContext
    from kcops.kernels.wire import Histogram

__all__ = ["Collector", "CollectorRunner", "SelfCollector", "build", "tick_histogram"]


def _on(switch: str, auto: bool) -> bool:
    return switch == "on" or (switch == "auto" and auto)


def build(ctx: AgentContext, ticks: Histogram) -> list[Collector]:
    """The collectors the configuration asks for, in the order they run.

    Publishes in ``ctx.services``: ``engine_pid_source`` (an
    :class:`~kcops.agent.collectors.enginepid.EnginePid`; ``.resolve()`` gives
    the engine pid now), ``engine_watch`` (the process tree watcher) and, with
    ``engine.url``, ``engine_client`` and ``engine_adapter`` (a callable giving
    the adapter name in use, or None before auto-detection has seen a page).
    """
    from kcops.agent.collectors.cpumem import CpuDeviceMemoryCollector
    from kcops.agent.collectors.engine_http import EngineClient
    from kcops.agent.collectors.enginepid import EnginePid
    from kcops.agent.collectors.health import HealthCollector
    from kcops.agent.collectors.nvml import Nvml, NvmlCollector
    from kcops.agent.collectors.probe import ProbeReceiver
    from kcops.agent.collectors.process import EngineEventsCollector, ProcessCollector
    from kcops.agent.collectors.procwatch import EngineWatch
    from kcops.agent.collectors.scrape import EngineScrapeCollector
    from kcops.agent.errors import ConfigError

    cfg = ctx.config.collectors
    eng = ctx.config.engine
    out: list[Collector] = []
    if cfg.self_metrics:
        out.append(SelfCollector(ticks, store=ctx.store))

    pids = EnginePid(pid=eng.pid, pidfile=eng.pidfile, services=ctx.services)
    watch = EngineWatch(
        pids,
        log_path=eng.log_path,
        log_tail_bytes=cfg.process.log_tail_bytes,
        services=ctx.services,
    )
    ctx.services["engine_pid_source"] = pids
    ctx.services["engine_watch"] = watch
    # A pid may be known: configured, supervised (`-- CMD`), or read from the
    # kcops worker's /admin/state once the engine at engine.url answers.
    pid_knowable = (
        pids.configured
        or bool(eng.command)
        or (eng.url is not None and eng.adapter in ("auto", "kcops"))
    )

    if cfg.probe.enabled:
        out.append(
            ProbeReceiver(
                cfg.probe.socket_path,
                max_processes=cfg.probe.max_processes,
                max_layers=cfg.probe.max_layers,
                max_frames_per_s=cfg.probe.max_frames_per_s,
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
        out.append(EngineEventsCollector(watch))
    if _on(cfg.device_memory.enabled, pid_knowable):
        out.append(CpuDeviceMemoryCollector(watch, limit_bytes=cfg.device_memory.limit_bytes))

    has_url = eng.url is not None
    for section, what in ((cfg.health, "health"), (cfg.scrape, "scrape")):
        if section.enabled == "on" and not has_url:
            raise ConfigError(
                f"collectors.{what}.enabled: 'on' needs engine.url (or --engine-url); "
                "allowed without it: auto, off"
            )
    want_health = _on(cfg.health.enabled, has_url)
    want_scrape = _on(cfg.scrape.enabled, has_url)
    if eng.url is not None and (want_health or want_scrape):
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
        )
        ctx.services["engine_client"] = client
        if want_health:
            out.append(HealthCollector(client))
        if want_scrape:
            scrape = EngineScrapeCollector(client, eng.adapter)
            out.append(scrape)
            # The engine dialect in use, once known (auto: after the first page).
            ctx.services["engine_adapter"] = lambda: scrape.adapter.name if scrape.adapter else None
    return out
