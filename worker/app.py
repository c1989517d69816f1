"""Wire the worker together: model, control, cache (+ Redis), faults, metrics, engine, HTTP.

:func:`build` makes a :class:`WorkerState` from :class:`WorkerOptions`;
:func:`serve_forever` runs it; :class:`Background` runs it in a thread (tests, bench).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from kcops.auth import TokenCheck
from kcops.httpedge import JsonErrorRunner
from kcops.tenant import DEFAULT_CAP, DEFAULT_HEADER, TenantLabels
from kcops.worker.cache import PrefixCache, release_freed_memory
from kcops.worker.control import Control
from kcops.worker.engine import MAX_COHORT, BatchEngine
from kcops.worker.faults import Faults
from kcops.worker.metrics import WorkerMetrics
from kcops.worker.redis_tier import RedisTier
from kcops.worker.server import WorkerState, build_app, error_body, live_state

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("kcops.worker")

ENGINE = "kcops"  # the engine label of the probe's series (kcops.kernels.wire.check_engine)


@dataclass
class WorkerOptions:
    model: str = "smollm2"
    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    redis_url: str | None = None
    redis_prefix: str = "kcops:kv:"
    enable_faults: bool = False
    long_threshold: int = 4096
    top_n: int = 64
    dense_layers: frozenset[int] = field(default_factory=lambda: frozenset({0, 1}))
    topn_min: int = 16
    topn_max: int = 1024
    shadow_fraction: float = 0.0
    cache_budget_bytes: int = 512 * 1024**2
    cache_ttl_s: float = 3600.0
    install_probe: bool = True
    progress: bool = True
    pidfile: Path | None = None
    tenant_header: str | None = DEFAULT_HEADER
    tenant_cap: int = DEFAULT_CAP


def install_probe() -> str:
    """Install kcops.kernels (item 7) so attention publishes K(C), timings and errors.

    Returns a short status; a probe that is missing or fails to install is reported,
    never fatal: the worker serves without it."""
    try:
        import kcops.kernels as kernels
    except ImportError as exc:  # pragma: no cover - kernels is part of the package
        return f"probe unavailable: {exc}"
    install = getattr(kernels, "install", None)
    if install is None:
        return "probe not installed: kcops.kernels.install() does not exist yet"
    try:
        # KCOPS_PROBE_* settings (sample rate, rows, p…) as for `kcops.kernels.run` and the
        # vLLM plugin. Its series say engine="kcops" (the agent's adapter name for this
        # worker), also when a probe was installed before (by `python -m kcops.kernels.run`).
        # A cohort decodes up to MAX_COHORT requests in one batch: a sampled call recomputes
        # a row of each, so that every request can get K(C) samples (kernels/attribution.py).
        config = kernels.ProbeConfig.from_env()
        config = dataclasses.replace(config, max_batch_rows=max(config.max_batch_rows, MAX_COHORT))
        install(config).set_engine(ENGINE)
    except Exception as exc:  # the probe must never stop the engine
        log.warning("kcops.kernels.install() failed: %s", exc)
        return f"probe install failed: {exc}"
    return "probe installed"


def _model(
    opts: WorkerOptions, model: PreTrainedModel | None, tokenizer: PreTrainedTokenizerBase | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model given, or loaded, with the probe's top-N attention as its implementation."""
    from kcops.kernels.topn import register
    from kcops.worker.models import load_model

    attn = register()
    if model is None:
        return load_model(opts.model, progress=opts.progress, attn_implementation=attn)
    if tokenizer is None:
        raise TypeError("build: a model given comes with its tokenizer")
    model.set_attn_implementation(attn)
    return model, tokenizer


def build(
    opts: WorkerOptions,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
) -> WorkerState:
    """Load (or take) the model and wire every part; nothing is started yet."""
    from kcops.worker.models import context_tokens

    model, tokenizer = _model(opts, model, tokenizer)
    name = Path(opts.model).name if opts.model not in ("tiny", "smollm2") else opts.model
    num_layers = int(model.config.num_hidden_layers)
    control = Control(
        long_threshold=opts.long_threshold,
        top_n=opts.top_n,
        dense_layers=opts.dense_layers,
        topn_min=opts.topn_min,
        topn_max=opts.topn_max,
        num_layers=num_layers,
    )
    # Read at scrape time, by when `state` (below) is bound.
    metrics = WorkerMetrics(name, lambda: live_state(state))
    cache = PrefixCache(budget_bytes=opts.cache_budget_bytes)
    redis_tier = None
    if opts.redis_url:
        redis_tier = RedisTier.from_url(
            opts.redis_url, opts.redis_prefix, int(opts.cache_ttl_s), metrics.transfer.observe
        )
        cache.loader, cache.spiller = redis_tier.load, redis_tier.store
    faults = Faults()
    engine = BatchEngine(
        model,
        tokenizer,
        model_name=name,
        control=control,
        cache=cache,
        faults=faults,
        metrics=metrics,
        shadow_fraction=opts.shadow_fraction,
    )
    state = WorkerState(
        engine=engine,
        control=control,
        faults=faults,
        metrics=metrics,
        model_name=name,
        context_tokens=context_tokens(model),
        tokens=TokenCheck(opts.token),
        redis=redis_tier,
        cache_ttl_s=opts.cache_ttl_s,
        enable_faults=opts.enable_faults,
        tenants=TenantLabels(opts.tenant_cap, opts.tenant_header),
    )

    def resize_cache(budget: int | None) -> None:
        with engine.cache_lock:
            cache.set_budget(budget or opts.cache_budget_bytes)
        release_freed_memory()

    faults.resize_cache = resize_cache
    return state


async def _serve(state: WorkerState, host: str, port: int, started: threading.Event) -> None:
    # handler_cancellation: a client that hangs up cancels its handler, which
    # marks the request cancelled so the model stops generating for nobody.
    runner = JsonErrorRunner(
        build_app(state), error_body, access_log=None, handler_cancellation=True
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    started.set()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve_forever(state: WorkerState, host: str, port: int) -> None:
    state.engine.start()
    try:
        asyncio.run(_serve(state, host, port, threading.Event()))
    finally:
        state.engine.stop()


class Background:
    """The worker's HTTP server and model loop in daemon threads (tests, benchmarks)."""

    def __init__(self, state: WorkerState, host: str, port: int) -> None:
        self.state, self.host, self.port = state, host, port
        self.url = f"http://{host}:{port}"
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._task: asyncio.Future[None] | None = None
        self._thread = threading.Thread(target=self._run, name="kcops-http", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._task = asyncio.ensure_future(
            _serve(self.state, self.host, self.port, self._started), loop=self._loop
        )
        with contextlib.suppress(asyncio.CancelledError):
            self._loop.run_until_complete(self._task)

    def __enter__(self) -> Background:
        self.state.engine.start()
        self._thread.start()
        if not self._started.wait(30):
            raise RuntimeError(f"worker did not start on {self.url}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.state.faults.clear()
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(10)
        self.state.engine.stop()
