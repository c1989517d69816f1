"""The kvpress side of ``kc sweep``: run in kvpress's own venv (``make venv-kvpress``).

kvpress pins ``transformers<5.3``, so it cannot share kcops' process: the lab
(:mod:`kcops.lab.kvpress`) writes a request (the model folder, the token sequences
it cut, where decoding starts, the jobs), this script runs each job and streams back
one JSON line per job with a file of its logits; the lab scores them. This file
imports only torch, transformers and kvpress, never kcops.

Per request: one prefill of ``seqs[:, :start]`` with full attention, each attention
layer's hook inputs kept. Per job: kvpress's own ``forward_hook`` of the press is
called on every layer with those inputs and a copy of the prefilled cache (what
``with press(model)`` does during a prefill: a layer's compression never feeds the
prefill's later layers, so one prefill serves every press); then the last tokens are
fed one at a time, teacher-forced, inside ``with press(model)`` (a decoding press
acts there), at their true positions.

    python kvpress_side.py REQUEST.pt OUTDIR
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, Protocol, TypedDict, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import DynamicCache, PreTrainedModel

SCORERS = ("snapkv", "streamingllm", "expected", "knorm", "tova")
DECODING = ("streamingllm", "knorm", "tova", "expected")  # SnapKV needs a 64-query window
Kwargs = dict[str, object]


class Job(TypedDict):
    press: str  # "full", a name of SCORERS, "pyramidkv", "adakv" or "per_layer"
    ratio: float  # kvpress's compression_ratio
    ratios: NotRequired[list[float]]  # per layer ("per_layer")
    decode_n: NotRequired[int]  # cut back to N keys at every decode step


class Press(Protocol):
    """What the side uses of a kvpress press (kvpress ships no types)."""

    def __call__(self, model: PreTrainedModel) -> contextlib.AbstractContextManager[None]: ...

    def forward_hook(
        self, module: nn.Module, _inputs: list[torch.Tensor], kwargs: Kwargs, output: object
    ) -> object: ...


def fingerprint(seqs: torch.Tensor) -> str:
    """The sequences' identity: both sides hash the same int64 bytes."""
    return hashlib.sha256(seqs.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def build(job: Job) -> Press:
    import kvpress as kp

    scorer = {
        "snapkv": kp.SnapKVPress,
        "streamingllm": kp.StreamingLLMPress,
        "expected": kp.ExpectedAttentionPress,
        "knorm": kp.KnormPress,
        "tova": kp.TOVAPress,
        "pyramidkv": kp.PyramidKVPress,
    }
    name, ratio = job["press"], job["ratio"]
    if name == "adakv":
        made = kp.AdaKVPress(press=kp.SnapKVPress(compression_ratio=ratio))
    elif name == "per_layer":
        made = kp.PerLayerCompressionPress(press=kp.SnapKVPress(), compression_ratios=job["ratios"])
    else:
        made = scorer[name](compression_ratio=ratio)
    if "decode_n" not in job:
        return cast(Press, made)
    return cast(
        Press,
        kp.PrefillDecodingPress(
            prefilling_press=made,
            decoding_press=kp.DecodingPress(
                base_press=scorer[name](), compression_interval=1, target_size=job["decode_n"]
            ),
        ),
    )


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    layers = cast(nn.ModuleList, model.get_decoder().layers)
    return [cast(nn.Module, layer.self_attn) for layer in layers]


def layer_kv(cache: DynamicCache) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for layer in cache.layers:
        yield cast(torch.Tensor, layer.keys), cast(torch.Tensor, layer.values)  # type: ignore[union-attr]


def prefill(model: PreTrainedModel, ids: torch.Tensor) -> tuple[list[Kwargs], DynamicCache]:
    """One full-attention prefill; each attention layer's hook kwargs and the cache."""
    from transformers import DynamicCache

    seen: list[Kwargs] = []

    def keep(_m: nn.Module, _args: object, kwargs: Kwargs, _out: object) -> None:
        seen.append(dict(kwargs))

    hooks = [m.register_forward_hook(keep, with_kwargs=True) for m in attention_modules(model)]
    cache = DynamicCache()
    try:
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
    return seen, cache


def _masked(module: nn.Module) -> int:
    """Keys AdaKV masks in this layer (kvpress keeps them in memory, hidden from
    attention: their saving is nominal), over every row and head."""
    masked = getattr(module, "masked_key_indices", None)
    return 0 if masked is None else len(masked[0])


def _unmask(module: nn.Module) -> None:
    vars(module)["masked_key_indices"] = None  # AdaKV's mask of the previous job


def kv_bytes(modules: Sequence[nn.Module], cache: DynamicCache) -> int:
    """Bytes of keys and values held for attention (AdaKV's masked keys left out)."""
    total = 0
    for (k, v), module in zip(layer_kv(cache), modules, strict=True):
        per_key = k.shape[-1] * k.element_size() + v.shape[-1] * v.element_size()
        total += k.nbytes + v.nbytes - _masked(module) * per_key
    return total


def kept(modules: Sequence[nn.Module], cache: DynamicCache) -> list[int]:
    """Keys per layer and head held for attention (AdaKV's masked ones left out)."""
    return [
        k.shape[2] - _masked(module) // (k.shape[0] * k.shape[1])
        for (k, _), module in zip(layer_kv(cache), modules, strict=True)
    ]


def run_job(model: PreTrainedModel, seen: list[Kwargs], full: DynamicCache, seqs: torch.Tensor,
            start: int, job: Job) -> dict[str, object]:  # fmt: skip
    from transformers import DynamicCache

    s, steps = seqs.shape[0], seqs.shape[1] - 1 - start
    modules = attention_modules(model)
    cache = DynamicCache()
    for i, (k, v) in enumerate(layer_kv(full)):
        cache.update(k.clone(), v.clone(), i)
    press = None if job["press"] == "full" else build(job)
    logits, times, peak, attended = [], [], 0, 0.0
    with torch.inference_mode(), press(model) if press else contextlib.nullcontext():
        for i, module in enumerate(modules if press else ()):
            _unmask(module)
            assert press is not None
            press.forward_hook(module, [], {**seen[i], "past_key_values": cache}, (None, None))
        budgets = kept(modules, cache)
        for j in range(steps):
            pos = start + j
            t0 = time.perf_counter()
            out = model(
                input_ids=seqs[:, pos : pos + 1], past_key_values=cache, use_cache=True,
                position_ids=torch.full((s, 1), pos), cache_position=torch.tensor([pos]),
            )  # fmt: skip
            times.append(time.perf_counter() - t0)
            logits.append(out.logits[:, -1].float())
            peak = max(peak, kv_bytes(modules, cache))
            attended += sum(k.shape[-2] for k, _ in layer_kv(cache)) / len(modules)
    for module in modules:
        _unmask(module)
    return {"logits": torch.stack(logits, dim=1), "step_s": statistics.median(times),
            "kv_bytes": peak // s, "keys_attended": attended / steps,
            "kept": budgets}  # fmt: skip


def main(request_path: str, out_dir: str) -> int:
    from importlib.metadata import version

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    req = torch.load(request_path, weights_only=True)
    torch.set_num_threads(int(req["threads"]))
    seqs: torch.Tensor = req["seqs"]
    start = int(req["start"])
    model = AutoModelForCausalLM.from_pretrained(
        req["model"], dtype=getattr(torch, req["dtype"]), attn_implementation="sdpa"
    ).eval()
    versions = {p: version(p) for p in ("kvpress", "transformers", "torch")}
    print(json.dumps({"sha": fingerprint(seqs), "versions": versions}), flush=True)
    seen, full = prefill(model, seqs[:, :start])
    out = Path(out_dir)
    for i, job in enumerate(req["jobs"]):
        res = run_job(model, seen, full, seqs, start, job)
        path = out / f"job-{i}.pt"
        torch.save(res.pop("logits"), path)
        print(json.dumps({"job": i, "logits": str(path), **res}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
