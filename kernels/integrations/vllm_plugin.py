"""vLLM: a general plugin that wraps every attention backend's ``Impl.forward``.

vLLM loads ``vllm.general_plugins`` entry points (setup.cfg declares
``kcops_probe = kcops.kernels.integrations.vllm_plugin:register``) in each of
its processes — API server, engine core, workers — so :func:`register` must be
cheap, idempotent and safe in every one of them.

The backends (``FlashAttentionImpl``, ``CPUAttentionBackendImpl``, …) all
subclass ``AttentionImpl`` (``vllm.v1.attention.backend``; older releases:
``vllm.attention.backends.abstract``) and are often imported only after the
plugins ran. The patch therefore wraps the ``forward`` of every subclass that
exists and hooks ``__init_subclass__`` to wrap the ones defined later.

Per call: NVTX range, call count, context length (``attn_metadata.max_seq_len``),
NaN/Inf check; per sampled call also timing and K(C) of the last query row of
each sequence, with its keys read from vLLM's paged KV cache through the block
table (:mod:`kcops.kernels.paged_kc`).

vLLM loads the plugin in its API server and engine core too, which never run
attention: there the publisher stays silent until a first attention call
(``Publisher.wait_for_attention``), so they add no all-zero series. Each process
logs one INFO line through vLLM's logger when the probe installs (naming the
backends wrapped so far), and one the first time it wraps each backend defined
later (vLLM imports the backend it picked after the plugins ran, so in a worker
that line is the one naming the backend in use).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from kcops.kernels.integrations import vllm_requests
from kcops.kernels.probe import KcInputs, Patch, Probe
from kcops.kernels.wire import UNKNOWN_LAYER

T = TypeVar("T")  # what the wrapped attention forward returns

BASE_MODULES: tuple[str, ...] = ("vllm.v1.attention.backend", "vllm.attention.backends.abstract")
WRAPPED_MARK = "__kcops_wrapped__"
ENGINE = "vllm"  # the engine label of every series this plugin's probe sends
_LAYER_RE = re.compile(r"layers\.(\d+)\.")
# The requests of this process's model runner (a worker's): which request each sampled
# K(C) row belongs to (vllm_requests). The runner's class is wrapped at the first
# attention call that finds it imported.
REQUESTS = vllm_requests.Requests()
_runner_hooked = False


def observe_finished(probe: Probe, done: vllm_requests.Finished) -> None:
    """A finished vLLM request into the probe's request histograms of its tenant (sent
    with the next flush; the agent exports ``kcops_request_*{model, tenant}``, ``unknown``
    when the request id carries no tenant). A request whose context the runner no longer
    knew is left out."""
    if done.context_tokens is not None and done.context_tokens > 0:
        probe.aggregator.observe_request(done.context_tokens, done.mean, done.tenant)


def hook_runner(probe: Probe) -> None:
    """Wrap the model runner's ``execute_model`` once it is imported (cheap until then: one
    dict lookup per attention call), sending finished requests and the model to ``probe``."""
    global _runner_hooked
    if _runner_hooked:
        return
    REQUESTS.on_finish = functools.partial(observe_finished, probe)
    REQUESTS.on_model = probe.set_model
    hang = vllm_requests.hang_file()
    try:
        wrapped = vllm_requests.install(REQUESTS, hang=hang)
    except Exception as exc:  # never into vLLM; rows stay unattributed
        _runner_hooked = True
        _logger().warning("kcops probe: not attributing K(C) to vLLM requests: %r", exc)
        return
    if wrapped:
        _runner_hooked = True
        if hang is not None:
            _logger().warning(
                "kcops TEST FAULT ARMED (pid %d): %s=%s: every engine step hangs in "
                "kcops_test_hang while that file exists. Tests only: unset it in production.",
                os.getpid(), vllm_requests.HANG_FILE_ENV, hang,
            )  # fmt: skip
        _info(
            f"kcops probe (pid {os.getpid()}) wrapped "
            f"{', '.join(c.__name__ for c in wrapped)}.execute_model: sampled K(C) rows are "
            "attributed to vLLM's requests (input_batch.req_ids)"
        )


def layer_of(layer: object) -> str:
    """Layer index from vLLM's attention layer, whose ``layer_name`` reads like
    ``model.layers.3.self_attn.attn``; ``unknown`` otherwise."""
    name = getattr(layer, "layer_name", None)
    if isinstance(name, str):
        m = _LAYER_RE.search(name + ".")
        if m:
            return m.group(1)
    return UNKNOWN_LAYER


def _context_tokens(attn_metadata: object) -> int | None:
    value = getattr(attn_metadata, "max_seq_len", None)
    return int(value) if isinstance(value, int) else None


def _arg(args: tuple[object, ...], kwargs: Mapping[str, object], i: int, name: str) -> object:
    """Argument ``name`` of ``forward(self, layer, query, key, value, kv_cache, attn_metadata,
    …)``, at position ``i`` of what follows ``query``, or by keyword."""
    return args[i] if len(args) > i else kwargs.get(name)


def _tensor(out: object) -> torch.Tensor | None:
    return out if isinstance(out, torch.Tensor) else None


def wrap_forward(probe: Probe, forward: Callable[..., T]) -> Callable[..., T]:
    """Instrumented ``Impl.forward(self, layer, query, key, value, kv_cache, attn_metadata, …)``."""
    if getattr(forward, WRAPPED_MARK, False):
        return forward

    @functools.wraps(forward)
    def wrapped(
        self: object, layer: object, query: torch.Tensor, *args: object, **kwargs: object
    ) -> T:
        if not _runner_hooked:
            hook_runner(probe)
        attn_metadata = _arg(args, kwargs, 3, "attn_metadata")

        def kc_inputs() -> KcInputs | None:
            # Only on sampled calls, inside the probe's error guard.
            from kcops.kernels import paged_kc

            return paged_kc.kc_inputs(
                self,
                query,
                _arg(args, kwargs, 0, "key"),
                _arg(args, kwargs, 2, "kv_cache"),
                attn_metadata,
                probe.config.max_batch_rows,
            )

        return probe.observe(
            layer_of(layer),
            forward,
            (self, layer, query, *args),
            kwargs,
            context_tokens=_context_tokens(attn_metadata),
            device_tensor=_tensor(query),
            output_of=_tensor,
            kc_inputs=kc_inputs,
        )

    setattr(wrapped, WRAPPED_MARK, True)
    wrapped.__kcops_original__ = forward  # type: ignore[attr-defined]
    return wrapped


class _ImplPatch(Patch):
    name = "vllm"

    def __init__(self, base: type, original_init_subclass: object) -> None:
        self.base = base
        self.original_init_subclass = original_init_subclass
        self.wrapped: list[type] = []
        # Set once the install line is out: classes wrapped after it get a line each.
        self.announce_wraps = False

    def wrap_class(self, probe: Probe, cls: type) -> None:
        forward = cls.__dict__.get("forward")
        if forward is None or getattr(forward, WRAPPED_MARK, False):
            return
        cls.forward = wrap_forward(probe, forward)  # type: ignore[attr-defined]
        self.wrapped.append(cls)
        if self.announce_wraps:
            _info(
                f"kcops probe (pid {os.getpid()}, engine {probe.publisher.engine}) wrapped "
                f"{cls.__name__}.forward: attention through it is counted, checked and "
                "sampled for K(C)"
            )

    def remove(self) -> None:
        for cls in self.wrapped:
            fwd = cls.__dict__.get("forward")
            original = getattr(fwd, "__kcops_original__", None)
            if original is not None:
                cls.forward = original  # type: ignore[attr-defined]
        self.wrapped.clear()
        if self.original_init_subclass is None:
            if "__init_subclass__" in self.base.__dict__:
                delattr(self.base, "__init_subclass__")
        else:
            self.base.__init_subclass__ = self.original_init_subclass  # type: ignore[method-assign,assignment]


def find_base(modules: tuple[str, ...] = BASE_MODULES) -> type | None:
    """vLLM's ``AttentionImpl`` base class, or None when vLLM is not importable."""
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        base = getattr(mod, "AttentionImpl", None)
        if isinstance(base, type):
            return base
    return None


def install(
    probe: Probe, modules: tuple[str, ...] | None = None, *, only_if_imported: bool = True
) -> Patch | None:
    """Wrap every ``AttentionImpl`` subclass, now and later. None when vLLM is absent.

    With ``only_if_imported`` (what :meth:`Probe.start` uses) nothing happens unless vLLM
    is already imported: a plain ``install()`` must not import vLLM. The plugin's
    :func:`register` runs inside vLLM and passes False.
    """
    import sys

    modules = BASE_MODULES if modules is None else modules
    if only_if_imported and not any(m in sys.modules for m in modules):
        return None
    base = find_base(modules)
    if base is None:
        return None
    base_cls: type = base
    original = base.__dict__.get("__init_subclass__")
    patch = _ImplPatch(base, original)

    def __init_subclass__(cls: type, **kw: object) -> None:
        if original is not None:
            original.__func__(cls, **kw)
        else:
            super(base_cls, cls).__init_subclass__(**kw)  # type: ignore[arg-type]
        patch.wrap_class(probe, cls)

    base.__init_subclass__ = classmethod(__init_subclass__)  # type: ignore[assignment]
    for cls in vllm_requests.classes(base)[1:]:
        patch.wrap_class(probe, cls)
    return patch


# The pid that logged "installed": one INFO line per process (vLLM calls register() several
# times per process, and a forked child must say it again).
_announced_pid: int | None = None


def _logger() -> logging.Logger:
    # A child of vLLM's "vllm" logger, so the line comes out with vLLM's handler and format.
    return logging.getLogger("vllm.plugins.kcops_probe")


def _announce(probe: Probe) -> None:
    global _announced_pid
    pid = os.getpid()
    if _announced_pid == pid:
        return
    _announced_pid = pid
    patch = probe.patches.get("vllm")
    wrapped = sorted(c.__name__ for c in getattr(patch, "wrapped", []))
    base = getattr(getattr(patch, "base", None), "__name__", "?")
    line = (
        f"kcops probe installed (pid {pid}) for engine {probe.publisher.engine}: wrapping "
        f"forward of every {base} subclass "
        f"(now: {', '.join(wrapped) or 'none yet'}); K(C) from the paged KV cache on "
        f"{probe.config.sample_rate:.3g} of calls; frames to {probe.config.socket_path} once "
        "attention runs"
    )
    _info(line)
    if isinstance(patch, _ImplPatch):
        patch.announce_wraps = True


def _info(line: str) -> None:
    log = _logger()
    if log.hasHandlers() and log.isEnabledFor(logging.INFO):
        log.info("%s", line)
    else:  # vLLM's logging not configured yet in this process (early CLI parsing)
        print(f"INFO {line}", file=sys.stderr, flush=True)


def register() -> None:
    """vLLM general-plugin entry point: install the probe in this process (idempotent).

    Honours ``KCOPS_PROBE=0`` (do nothing) and the ``KCOPS_PROBE_*`` settings. Never
    raises: a probe that cannot install must not stop vLLM from serving.
    """
    if os.environ.get("KCOPS_PROBE", "1").strip() in ("0", "false", "no", "off"):
        return
    try:
        import kcops.kernels as kernels
        from kcops.kernels.config import ProbeConfig

        probe = kernels.install(ProbeConfig.from_env())
        # The plugin knows where it runs, also when a probe was installed before it (by
        # `python -m kcops.kernels.run`): frames say engine="vllm".
        probe.set_engine(ENGINE)
        # API server and engine core load the plugin but never run attention: stay silent there.
        probe.publisher.wait_for_attention = True
        probe.ensure_integration("vllm", lambda p: install(p, only_if_imported=False))
        _announce(probe)
    except Exception as exc:
        _logger().warning("kcops probe not installed in vLLM: %r", exc)
