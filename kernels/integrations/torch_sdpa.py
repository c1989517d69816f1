"""Plain torch: wrap ``torch.nn.functional.scaled_dot_product_attention``.

A plain-torch model has no layer index to give, so these calls count under
layer ``unknown``. Calls made from inside another instrumented call (transformers'
``sdpa`` calls this function) are not counted twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from kcops.kernels.probe import KcInputs, Patch, Probe
from kcops.kernels.wire import UNKNOWN_LAYER

_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")


class _SdpaPatch(Patch):
    name = "torch_sdpa"

    def __init__(self, original: Callable[..., torch.Tensor]) -> None:
        self.original = original

    def remove(self) -> None:
        import torch.nn.functional as F

        F.scaled_dot_product_attention = self.original


def _tensor(value: object) -> torch.Tensor | None:
    return value if isinstance(value, torch.Tensor) else None


def install(probe: Probe) -> Patch | None:
    import torch.nn.functional as F

    # Its own signature is torch's; the wrapper passes on whatever it was called with.
    original: Callable[..., torch.Tensor] = F.scaled_dot_product_attention
    if getattr(original, "__kcops_wrapped__", False):
        return None

    @functools.wraps(original)
    def sdpa(*args: object, **kwargs: object) -> torch.Tensor:
        # called from another instrumented call (transformers' sdpa: every call there):
        # already measured. Probe.busy() written out, one frame less on that path.
        if getattr(probe._local, "busy", False):
            return original(*args, **kwargs)
        bound = dict(zip(_PARAMS, args, strict=False))
        bound.update((k, v) for k, v in kwargs.items() if k in _PARAMS)
        query, key = _tensor(bound.get("query")), _tensor(bound.get("key"))

        def kc_inputs() -> KcInputs | None:
            if query is None or key is None or query.dim() != 4 or key.dim() != 4:
                return None
            if query.shape[1] % key.shape[1]:
                return None
            causal = bool(bound.get("is_causal", False))
            if causal and query.shape[-2] != key.shape[-2]:
                return None  # torch aligns this causal mask top-left; K(C) assumes bottom-right
            scale = bound.get("scale")
            scaling = float(scale) if isinstance(scale, int | float) else None
            return KcInputs(query, key, _tensor(bound.get("attn_mask")), scaling, causal)

        return probe.observe(
            UNKNOWN_LAYER,
            original,
            args,
            kwargs,
            context_tokens=int(key.shape[-2]) if key is not None else None,
            device_tensor=query,
            output_of=_tensor,
            kc_inputs=kc_inputs,
        )

    sdpa.__kcops_wrapped__ = True  # type: ignore[attr-defined]
    F.scaled_dot_product_attention = sdpa
    return _SdpaPatch(original)
