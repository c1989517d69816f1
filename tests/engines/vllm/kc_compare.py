"""Per-layer K_p of query rows: vLLM (the probe, from its paged KV cache) vs transformers'
eager attention weights, computed here with no kcops code.

Run with .venv-vllm's python (it has vLLM, torch and transformers):

    python kc_compare.py MODEL_FOLDER TOKENS [TOKENS ...]

One batch of prompts of those lengths (not block multiples, so the last block of each is
partly filled) goes through vLLM for two steps: the prefill, whose last query row sees the
prompt, and one decode step, whose one row sees the prompt plus the first generated token.
The reference runs transformers with ``attn_implementation="eager"`` and
``output_attentions=True`` on the prompt plus that token, and reads the softmax weights of
the same two rows; K_p is computed from them below, from the definition (docs/kc.md), with
none of kcops' code. Prints one JSON object:
``{"rows": {"<prompt>:<visible>": {"vllm": {layer: K}, "reference": {layer: K}}}, ...}``.

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the probe's records
are readable here (the served engine's are not); its plugin is off (``KCOPS_PROBE=0``) and
the probe is installed by hand with every call sampled and rows recorded.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["KCOPS_PROBE"] = "0"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

P = 0.9


def prompt_ids(tokenizer: object, n: int, offset: int) -> list[int]:
    """``n`` tokens of Python's own help texts, starting ``offset`` topics in (so two
    prompts share no prefix and the prefix cache plays no part)."""
    import pydoc_data.topics as topics

    text = "\n".join(str(v) for v in list(topics.topics.values())[offset : offset + 40])
    ids = list(tokenizer(text)["input_ids"][:n])  # type: ignore[operator]
    assert len(ids) == n, (len(ids), n)
    return ids


def k_union_reference(weights: object, p: float, groups: int) -> int:
    """K_p of one query row from its attention weights ``[heads, keys]`` (float tensor):
    per head, the least k whose k largest weights sum to >= p; the union of those top-k
    key sets over the heads of each KV group; the largest union."""
    import torch

    w = weights.double()  # type: ignore[attr-defined]
    heads = w.shape[0]
    per_group = heads // groups
    order = torch.argsort(w, dim=-1, descending=True)
    cum = torch.gather(w, -1, order).cumsum(-1)
    sizes = [min(int((cum[h] < p).sum()) + 1, w.shape[-1]) for h in range(heads)]
    best = 0
    for g in range(groups):
        keys: set[int] = set()
        for h in range(g * per_group, (g + 1) * per_group):
            keys.update(order[h, : sizes[h]].tolist())
        best = max(best, len(keys))
    return best


def reference(model: object, ids: list[int], rows: list[int], groups: int) -> dict:
    """{row's visible keys: {layer: K_p}} from transformers' eager weights of ``rows``."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([ids]), output_attentions=True)  # type: ignore[operator]
    got: dict[int, dict[str, int]] = {}
    for r in rows:
        got[r + 1] = {
            str(layer): k_union_reference(att[0, :, r, : r + 1], P, groups)
            for layer, att in enumerate(out.attentions)
        }
    return got


def main() -> None:
    folder, lengths = sys.argv[1], [int(x) for x in sys.argv[2:]]
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    import kcops.kernels as kernels
    from kcops.kernels import paged_kc
    from kcops.kernels.config import ProbeConfig
    from kcops.kernels.integrations import vllm_plugin

    tok = AutoTokenizer.from_pretrained(folder)
    prompts = [prompt_ids(tok, n, 40 * i) for i, n in enumerate(lengths)]
    llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0)
    probe = kernels.install(
        ProbeConfig(
            sample_rate=1.0,
            record=True,
            publish=False,
            p_values=(P,),
            nvtx=False,
            integrations=(),
            max_batch_rows=len(prompts),
        )
    )
    probe.ensure_integration("vllm", lambda pr: vllm_plugin.install(pr, only_if_imported=False))
    probe.records.clear()
    outs = llm.generate(
        [{"prompt_token_ids": ids} for ids in prompts],
        SamplingParams(max_tokens=2, temperature=0, ignore_eos=True),
    )
    # rows seen by vLLM, keyed by how many keys the row sees (distinct per prompt and step)
    seen: dict[int, dict[str, int]] = {}
    for layer, row in probe.records:
        seen.setdefault(row.visible, {})[str(layer)] = row.k_union[P]
    internal = probe.internal_errors
    layouts = {cls.__name__: name for cls, name in paged_kc._layout_of.items()}
    cfg = AutoConfig.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    )
    rows: dict[str, dict] = {}
    for i, (ids, out) in enumerate(zip(prompts, outs, strict=True)):
        first = out.outputs[0].token_ids[0]  # the decode step's query token
        n = len(ids)
        ref = reference(model, [*ids, first], [n - 1, n], cfg.num_key_value_heads)
        for visible, label in ((n, "prefill"), (n + 1, "decode")):
            rows[f"{i}:{label}:{visible}"] = {
                "vllm": seen.get(visible, {}),
                "reference": ref[visible],
            }
    print(json.dumps({"rows": rows, "internal_errors": internal, "layouts": layouts}))


if __name__ == "__main__":
    main()
