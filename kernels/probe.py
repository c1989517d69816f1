"""The probe: what happens around every instrumented attention call.

Always: an NVTX range named for the layer, a call counter, the context length
and (by default) a NaN/Inf check of the output (checked in groups of calls, see
kcops.kernels.errcheck; counted by the next flush at the latest). On a sampled call: wall time
(CUDA events on a GPU, read at flush; ``perf_counter_ns`` on the CPU) and K(C)
of a few query rows, by layer. Exceptions of the kernel are counted and re-raised; an
exception of the probe's own measuring is counted in ``internal_errors`` (and sent:
``kcops_probe_internal_errors_total``) and swallowed, so the probe cannot break the
engine.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

from kcops.kernels import attribution
from kcops.kernels.aggregate import Aggregator
from kcops.kernels.config import ProbeConfig
from kcops.kernels.errcheck import GROUP_CALLS, SMALL_NUMEL, ErrorCheck
from kcops.kernels.kc import KcResult, KcRow, kc_rows
from kcops.kernels.publisher import Publisher
from kcops.kernels.ranges import Ranges
from kcops.kernels.wire import check_engine, clip

log = logging.getLogger("kcops.kernels")

# Deferred GPU readings waiting for the flush; beyond this many the oldest go.
MAX_DEFERRED = 4096
T = TypeVar("T")  # what the instrumented attention call returns
# The skip count of a probe that never samples (sample_rate 0).
NEVER = 1 << 62


@dataclass
class KcInputs:
    """What K(C) needs from one call: q ``[B, Hq, Tq, d]``, k ``[B, Hkv, Tk, d]``."""

    query: torch.Tensor
    key: torch.Tensor
    attention_mask: torch.Tensor | None
    scaling: float | None
    is_causal: bool = True
    # The engine's batch entry of each of the B rows (kcops.kernels.attribution), when the
    # integration left some out (paged_kc skips sequences it cannot read); None: entry b.
    entries: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Timing:
    """A sampled call's CUDA events, read (synchronised) by the publisher thread."""

    start: torch.cuda.Event
    end: torch.cuda.Event


@dataclass(frozen=True)
class KcReading:
    """A sampled call's K(C) on the GPU, recorded by the publisher thread."""

    layer: str
    result: KcResult
    owners: tuple[attribution.RequestKC | None, ...] | None


Deferred = Timing | KcReading


class Patch:
    """An installed patch of one integration; ``remove()`` undoes it."""

    name: str = ""

    def remove(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def _integration_installers() -> dict[str, Callable[[Probe], Patch | None]]:
    from kcops.kernels.integrations import torch_sdpa, transformers_attn, vllm_plugin

    return {
        "transformers": transformers_attn.install,
        "torch_sdpa": torch_sdpa.install,
        "vllm": vllm_plugin.install,
    }


class Probe:
    """Created and started by :func:`kcops.kernels.install`; one per process."""

    def __init__(self, config: ProbeConfig) -> None:
        self.config = config
        self.aggregator = Aggregator(config.topn)
        self.errcheck = ErrorCheck(self.aggregator)
        self.publisher = Publisher(
            self.aggregator,
            config.socket_path,
            config.flush_interval_ms / 1000.0,
            before_flush=self._resolve_deferred,
            enabled=config.publish,
            engine=config.engine,
            p=config.p_values[0],
            kc_every=max(1, round(config.kc_layers_interval_ms / config.flush_interval_ms)),
        )
        self.ranges = Ranges(config.nvtx)
        self.records: list[tuple[str, KcRow]] = []
        self.internal_errors = 0
        self.patches: dict[str, Patch] = {}
        self._rate = config.sample_rate
        self._rng = random.Random(config.seed)
        self._skip = self._draw_skip()  # unsampled calls before the next sampled one
        self._check = config.check_every_call
        self._local = threading.local()
        self._deferred: deque[Deferred] = deque(maxlen=MAX_DEFERRED)
        # unsampled calls not counted yet: (layer, context tokens, small CPU output or None)
        self._pending: deque[tuple[str, int | None, torch.Tensor | None]] = deque()
        self._names: dict[str, str] = {}
        self._p0 = config.p_values[0]
        self._active = False

    # lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        installers = _integration_installers()
        for name in self.config.integrations:
            self.ensure_integration(name, installers[name])
        self._active = True
        self.publisher.start()

    def set_engine(self, engine: str) -> None:
        """Name the engine this probe runs in (the ``engine`` label of its series) from now
        on: an integration that knows it (vLLM's plugin) overrides the configured one.
        Raises :class:`kcops.kernels.wire.WireError` for a name ``check_engine`` refuses."""
        self.publisher.engine = check_engine(engine)

    def set_model(self, model: str) -> None:
        """Name the served model (the ``model`` label of the request histograms an
        integration that attributes K(C) to requests observes); cut to a label's length."""
        self.publisher.model = clip(model).decode(errors="ignore")

    def ensure_integration(self, name: str, installer: Callable[[Probe], Patch | None]) -> bool:
        """Install one integration if not installed yet (idempotent); False if its engine is
        not importable."""
        if name in self.patches:
            return True
        patch = installer(self)
        if patch is None:
            return False
        self.patches[name] = patch
        return True

    def stop(self) -> None:
        self._active = False
        for patch in reversed(list(self.patches.values())):
            patch.remove()
        self.patches.clear()
        self.publisher.stop(flush=True)

    def after_fork_in_child(self) -> None:
        """Called in a forked child (see :func:`kcops.kernels.install`): new locks, new
        publisher identity and thread."""
        if self._active:
            self._local = threading.local()
            self._pending.clear()  # the parent counts its own calls
            self.aggregator.after_fork_in_child()
            self.publisher.after_fork_in_child()

    # hot path ------------------------------------------------------------------

    def range_name(self, layer: str) -> str:
        name = self._names.get(layer)
        if name is None:
            name = self._names[layer] = f"kcops.attention.layer{layer}"
        return name

    def set_sample_rate(self, rate: float) -> None:
        """Sample each call with probability ``rate`` from the next call on."""
        self._rate = rate
        self._skip = self._draw_skip()

    def _draw_skip(self) -> int:
        """How many calls go unsampled before the next sampled one: a geometric draw, so
        that every call is still sampled with probability ``sample_rate``, independently,
        but the hot path pays a draw per *sampled* call, not per call."""
        rate = self._rate
        if rate <= 0.0:
            return NEVER
        if rate >= 1.0:
            return 0
        u = 1.0 - self._rng.random()  # (0, 1]
        return min(NEVER, int(math.log(u) / math.log1p(-rate)))

    def busy(self) -> bool:
        """True while an instrumented call runs on this thread."""
        return getattr(self._local, "busy", False)

    def observe(
        self,
        layer: str,
        fn: Callable[..., T],
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        *,
        context_tokens: int | None,
        device_tensor: torch.Tensor | None,
        output_of: Callable[[T], torch.Tensor | None],
        kc_inputs: Callable[[], KcInputs | None] | None = None,
    ) -> T:
        """Run ``fn(*args, **kwargs)`` for ``layer`` and measure it. Returns its result
        unchanged. A call made while another instrumented call runs on the same thread (an
        integration calling another, e.g. transformers' sdpa calling torch's) passes through.

        Every call is counted, runs inside its NVTX range (when a tool listens) and has its
        output checked for NaN/Inf; a sampled one (see :meth:`_draw_skip`) is also timed
        and measured for K(C) in :meth:`_observe_sampled`.

        The unsampled path runs on every attention call, between kernels that evict it from
        the CPU's caches, so what it costs is mostly how much code and data it touches: it
        is written out here in one frame, and it only appends ``(layer, context, output)``
        to a queue; every ``GROUP_CALLS`` calls (and before every flush) :meth:`_settle`
        counts the queued calls and checks their outputs together."""
        local = self._local
        if getattr(local, "busy", False):
            return fn(*args, **kwargs)
        skip = self._skip
        if not skip:
            self._skip = self._draw_skip()
            local.busy = True
            try:
                self.aggregator.call(layer, context_tokens)
                return self._observe_sampled(
                    layer, fn, args, kwargs, device_tensor, output_of, kc_inputs
                )
            finally:
                local.busy = False
        self._skip = skip - 1
        ranges: Ranges | None = self.ranges if self.ranges.active else None
        if ranges is not None:
            ranges.push(self.range_name(layer))
        local.busy = True
        try:
            out = fn(*args, **kwargs)
        except Exception:
            self.aggregator.call(layer, context_tokens)
            self.aggregator.error("exception")
            raise
        finally:
            local.busy = False
            if ranges is not None:
                ranges.pop()
        self._queue(layer, context_tokens, out, output_of)
        return out

    def _queue(
        self,
        layer: str,
        context_tokens: int | None,
        out: T,
        output_of: Callable[[T], torch.Tensor | None],
    ) -> None:
        """An unsampled call: queued with its output when that is small and on the CPU, and
        checked now when it is not (on an accelerator, no sync there; large, not worth
        pinning)."""
        tensor = None
        if self._check:
            try:
                tensor = output_of(out)
                if tensor is not None and (not tensor.is_cpu or tensor.numel() > SMALL_NUMEL):
                    self.errcheck.check(tensor)
                    tensor = None
            except Exception as exc:
                self._measure_failed(exc)
                tensor = None
        pending = self._pending
        pending.append((layer, context_tokens, tensor))
        if len(pending) >= GROUP_CALLS:
            try:
                self._settle()
            except Exception as exc:  # the probe must not break the engine
                self._measure_failed(exc)

    def _settle(self) -> None:
        """Count the queued unsampled calls and check their small CPU outputs as one group
        (:meth:`ErrorCheck.check_cpu_group`). Engine threads and the publisher may settle
        at once: each queued call is taken by one of them."""
        pending = self._pending
        batch: list[tuple[str, int | None, torch.Tensor | None]] = []
        try:
            for _ in range(len(pending)):
                batch.append(pending.popleft())
        except IndexError:  # another thread took the rest
            pass
        if not batch:
            return
        self.aggregator.call_many([(layer, tokens) for layer, tokens, _ in batch])
        try:
            outs = [t for _, _, t in batch if t is not None and t.is_floating_point() and t.numel()]
            if outs:
                self.errcheck.check_cpu_group(outs)
        except Exception as exc:
            self._measure_failed(exc)

    def _observe_sampled(
        self,
        layer: str,
        fn: Callable[..., T],
        args: tuple[object, ...],
        kwargs: Mapping[str, object],
        device_tensor: torch.Tensor | None,
        output_of: Callable[[T], torch.Tensor | None],
        kc_inputs: Callable[[], KcInputs | None] | None,
    ) -> T:
        cuda = device_tensor is not None and device_tensor.is_cuda
        sampled = not (cuda and torch.cuda.is_current_stream_capturing())
        # under CUDA graph capture events and K(C) results would be graph-internal: the
        # call is only counted and checked, like an unsampled one
        start_ev: torch.cuda.Event | None = None
        t0 = 0
        self.ranges.push(self.range_name(layer))
        try:
            if sampled:
                if cuda:
                    start_ev = torch.cuda.Event(enable_timing=True)
                    start_ev.record()
                else:
                    t0 = time.perf_counter_ns()
            try:
                out = fn(*args, **kwargs)
            except Exception:
                self.aggregator.error("exception")
                raise
            if sampled:
                if cuda:
                    end_ev = torch.cuda.Event(enable_timing=True)
                    end_ev.record()
                    assert start_ev is not None
                    self._deferred.append(Timing(start_ev, end_ev))
                else:
                    self.aggregator.observe_seconds((time.perf_counter_ns() - t0) / 1e9)
        finally:
            self.ranges.pop()
        if sampled or self._check:
            self._measure(layer, out, output_of, kc_inputs if sampled else None)
        return out

    def _measure(
        self,
        layer: str,
        out: T,
        output_of: Callable[[T], torch.Tensor | None],
        kc_inputs: Callable[[], KcInputs | None] | None,
    ) -> None:
        try:
            tensor = output_of(out)
            if tensor is not None:
                self.errcheck.check(tensor)
            if kc_inputs is not None:
                inputs = kc_inputs()
                if inputs is not None:
                    self._kc(layer, inputs)
        except Exception as exc:
            self._measure_failed(exc)

    def _measure_failed(self, exc: Exception) -> None:
        self._internal_error()
        if self.internal_errors == 1:
            log.warning("kcops probe: measuring failed (reported once): %r", exc)

    def _internal_error(self) -> None:
        """Count a failure of the probe's own measuring, here and in the next frame."""
        self.internal_errors += 1
        self.aggregator.internal_error()

    def _kc(self, layer: str, inputs: KcInputs) -> None:
        cfg = self.config
        result = kc_rows(
            inputs.query,
            inputs.key,
            attention_mask=inputs.attention_mask,
            scaling=inputs.scaling,
            rows=cfg.rows,
            p_values=cfg.p_values,
            topn=cfg.topn,
            is_causal=inputs.is_causal,
            max_batch=cfg.max_batch_rows,
        )
        owners = attribution.current()  # read here: the engine's thread knows the batch
        if owners is not None and inputs.entries is not None:
            owners = tuple(owners[i] if i < len(owners) else None for i in inputs.entries)
        if inputs.query.is_cuda and not cfg.record:
            self._deferred.append(KcReading(layer, result, owners))
        else:
            self._record(layer, result, owners)

    def _record(
        self,
        layer: str,
        result: KcResult,
        owners: tuple[attribution.RequestKC | None, ...] | None = None,
    ) -> None:
        p0 = self._p0
        for row in result.to_rows():
            k = row.k_union[p0]
            self.aggregator.observe_kc(layer, k, row.kappa(p0), row.topn_mass)
            if owners is not None and row.batch < len(owners):
                owner = owners[row.batch]
                if owner is not None:
                    owner.add(k)
            if self.config.record:
                self.records.append((layer, row))

    # publisher thread ----------------------------------------------------------

    def _resolve_deferred(self) -> None:
        """Read GPU timings, K(C) results and error flags (syncs this thread, not the engine)."""
        while self._deferred:
            item = self._deferred.popleft()
            try:
                if isinstance(item, Timing):
                    item.end.synchronize()
                    self.aggregator.observe_seconds(item.start.elapsed_time(item.end) / 1000.0)
                else:
                    self._record(item.layer, item.result, item.owners)
            except Exception:
                self._internal_error()
        try:
            self._settle()
            self.errcheck.drain()
        except Exception:
            self._internal_error()

    def resolve_pending(self) -> None:
        """Bring everything measured so far into the aggregate now: deferred GPU readings,
        K(C) results and the NaN/Inf checks still pending in a group. A flush does this
        first; tests that read ``aggregator`` directly call it."""
        self._resolve_deferred()

    def flush(self) -> int:
        """Publish now, K(C) by layer included (tests and ``uninstall``); returns frames
        sent."""
        return self.publisher.flush(kc=True)
