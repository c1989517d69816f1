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
from pathlib import Path
from typing import Any

import torch

SCORERS = ("snapkv", "streamingllm", "expected", "knorm", "tova")
DECODING = ("streamingllm", "knorm", "tova", "expected")  # SnapKV needs a 64-query window


def fingerprint(seqs: torch.Tensor) -> str:
    """The sequences' identity: both sides hash the same int64 bytes."""
    return hashlib.sha256(seqs.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def build(press: str, ratio: float, ratios: list[float] | None, decode_n: int | None) -> Any:
    import kvpress as kp

    scorer = {
        "snapkv": kp.SnapKVPress,
        "streamingllm": kp.StreamingLLMPress,
        "expected": kp.ExpectedAttentionPress,
        "knorm": kp.KnormPress,
        "tova": kp.TOVAPress,
        "pyramidkv": kp.PyramidKVPress,
    }
    if press == "adakv":
        made = kp.AdaKVPress(press=kp.SnapKVPress(compression_ratio=ratio))
    elif press == "per_layer":
        made = kp.PerLayerCompressionPress(press=kp.SnapKVPress(), compression_ratios=ratios or [])
    else:
        made = scorer[press](compression_ratio=ratio)
    if decode_n is None:
        return made
    return kp.PrefillDecodingPress(
        prefilling_press=made,
        decoding_press=kp.DecodingPress(
            base_press=scorer[press](), compression_interval=1, target_size=decode_n
        ),
    )


def attention_modules(model: Any) -> list[Any]:
    return [layer.self_attn for layer in model.model.layers]


def prefill(model: Any, ids: torch.Tensor) -> tuple[list[dict[str, Any]], Any]:
    """One full-attention prefill; each attention layer's hook kwargs and the cache."""
    from transformers import DynamicCache

    seen: list[dict[str, Any]] = []

    def keep(_m: Any, _args: Any, kwargs: dict[str, Any], _out: Any) -> None:
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


def kv_bytes(model: Any, cache: Any) -> int:
    """Bytes of keys and values held, less the keys AdaKV only masks (kvpress keeps them
    in memory and hides them from attention: their saving is nominal)."""
    total = 0
    for layer, module in zip(cache.layers, attention_modules(model), strict=True):
        k, v = layer.keys, layer.values
        total += k.nbytes + v.nbytes
        masked = getattr(module, "masked_key_indices", None)
        if masked is not None:
            total -= len(masked[0]) * (
                k.shape[-1] * k.element_size() + v.shape[-1] * v.element_size()
            )
    return total


def kept(model: Any, cache: Any) -> list[int]:
    """Keys per layer and head held for attention (AdaKV's masked ones left out)."""
    out = []
    for layer, module in zip(cache.layers, attention_modules(model), strict=True):
        b, h, n, _ = layer.keys.shape
        masked = getattr(module, "masked_key_indices", None)
        out.append(n - (len(masked[0]) // (b * h) if masked is not None else 0))
    return out


def run_job(model: Any, seen: list[dict[str, Any]], full: Any, seqs: torch.Tensor,
            start: int, job: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    from transformers import DynamicCache

    s, steps = seqs.shape[0], seqs.shape[1] - 1 - start
    cache: Any = DynamicCache()
    for i, layer in enumerate(full.layers):
        cache.update(layer.keys.clone(), layer.values.clone(), i)
    press: Any = None if job["press"] == "full" else build(
        job["press"], job["ratio"], job.get("ratios"), job.get("decode_n")
    )  # fmt: skip
    logits, times, peak, attended = [], [], 0, 0.0
    with torch.inference_mode(), press(model) if press is not None else contextlib.nullcontext():
        for module in attention_modules(model) if press is not None else ():
            module.masked_key_indices = None
            kwargs = {**seen[module.layer_idx], "past_key_values": cache}
            press.forward_hook(module, [], kwargs, (None, None))
        budgets = kept(model, cache)
        for j in range(steps):
            pos = start + j
            t0 = time.perf_counter()
            out = model(
                input_ids=seqs[:, pos : pos + 1], past_key_values=cache, use_cache=True,
                position_ids=torch.full((s, 1), pos), cache_position=torch.tensor([pos]),
            )  # fmt: skip
            times.append(time.perf_counter() - t0)
            logits.append(out.logits[:, -1].float())
            peak = max(peak, kv_bytes(model, cache))
            attended += sum(layer.keys.shape[-2] for layer in cache.layers) / len(cache.layers)
    for module in attention_modules(model):
        module.masked_key_indices = None
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
