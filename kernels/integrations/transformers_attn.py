"""transformers: wrap every attention function a model dispatches to.

Models look their attention function up with
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``
on every forward. Patching ``AttentionInterface.get_interface`` therefore
instruments ``eager`` (the default argument), ``sdpa``, flash and anything
registered later (the worker's ``kcops_topn``), with the layer index read from
the attention module (``module.layer_idx``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kcops.kernels.probe import KcInputs, Patch, Probe
from kcops.kernels.wire import UNKNOWN_LAYER

if TYPE_CHECKING:
    from torch import nn
    from transformers.modeling_utils import AttentionInterface

WRAPPED_MARK = "__kcops_wrapped__"
# transformers' attention functions: (module, q, k, v, mask, ...) -> (output, weights)
AttentionFn = Callable[..., "tuple[torch.Tensor, torch.Tensor | None]"]
GetInterface = Callable[["AttentionInterface", str, AttentionFn], AttentionFn]


def _first(out: object) -> torch.Tensor | None:
    first = out[0] if isinstance(out, tuple) else out
    return first if isinstance(first, torch.Tensor) else None


def wrap_attention(probe: Probe, fn: AttentionFn) -> AttentionFn:
    """The instrumented version of a transformers attention function
    ``fn(module, query, key, value, attention_mask, *args, **kwargs) -> (out, weights)``."""
    if getattr(fn, WRAPPED_MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapped(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        *args: object,
        **kw: object,  # scaling, dropout, ...: transformers' own, passed on as they come
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        layer_idx = getattr(module, "layer_idx", None)
        layer = str(layer_idx) if layer_idx is not None else UNKNOWN_LAYER

        def kc_inputs() -> KcInputs | None:
            if query.dim() != 4 or key.dim() != 4:
                return None
            # Only by keyword: the first extra positional of sdpa/flash is dropout.
            scaling = kw.get("scaling")
            return KcInputs(
                query,
                key,
                attention_mask,
                float(scaling) if isinstance(scaling, int | float) else None,
                bool(getattr(module, "is_causal", True)),
            )

        shape = getattr(key, "shape", None)
        return probe.observe(
            layer,
            fn,
            (module, query, key, value, attention_mask, *args),
            kw,
            context_tokens=shape[-2] if shape is not None else None,  # torch.Size: ints
            device_tensor=query,
            output_of=_first,
            kc_inputs=kc_inputs,
        )

    setattr(wrapped, WRAPPED_MARK, True)
    return wrapped


class _InterfacePatch(Patch):
    name = "transformers"

    def __init__(self, cls: type, original: GetInterface) -> None:
        self.cls = cls
        self.original = original

    def remove(self) -> None:
        self.cls.get_interface = self.original  # type: ignore[attr-defined]


def install(probe: Probe) -> Patch | None:
    """Patch ``AttentionInterface.get_interface``; None when transformers is absent or too old."""
    try:
        from transformers.modeling_utils import AttentionInterface
    except ImportError:
        return None
    original: GetInterface | None = AttentionInterface.__dict__.get("get_interface")
    if original is None:
        return None
    cache: dict[AttentionFn, AttentionFn] = {}

    def get_interface(
        self: AttentionInterface, attn_implementation: str, default: AttentionFn
    ) -> AttentionFn:
        fn = original(self, attn_implementation, default)
        wrapped = cache.get(fn)
        if wrapped is None:
            wrapped = cache[fn] = wrap_attention(probe, fn)
        return wrapped

    AttentionInterface.get_interface = get_interface  # type: ignore[method-assign]
    return _InterfacePatch(AttentionInterface, original)
