"""Per-layer K_p of one prompt's last query row: vLLM (paged KV cache) vs transformers eager.

Run with .venv-vllm's python (it has vLLM, torch and transformers):

    python kc_compare.py MODEL_FOLDER TOKENS

Prints one JSON object: ``{"tokens": n, "vllm": {layer: K}, "transformers": {layer: K}}``.
vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) so the probe's records
are readable here; its plugin is off (``KCOPS_PROBE=0``) and the probe is installed by
hand with every call sampled and rows recorded.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["KCOPS_PROBE"] = "0"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def prompt_ids(tokenizer: object, n: int) -> list[int]:
    import pydoc_data.topics as topics

    text = "\n".join(str(v) for v in list(topics.topics.values())[:20])
    return list(tokenizer(text)["input_ids"][:n])  # type: ignore[operator]


def by_layer(records: list, tokens: int, p: float) -> dict[str, int]:
    """K_p (union over heads per KV group, the largest group) of the row that sees all
    ``tokens`` keys, per layer."""
    return {layer: row.k_union[p] for layer, row in records if row.visible == tokens}


def main() -> None:
    folder, n = sys.argv[1], int(sys.argv[2])
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import LLM, SamplingParams

    import kcops.kernels as kernels
    from kcops.kernels.config import ProbeConfig
    from kcops.kernels.integrations import vllm_plugin

    p = 0.9
    tok = AutoTokenizer.from_pretrained(folder)
    ids = prompt_ids(tok, n)
    llm = LLM(model=folder, dtype="float32", enforce_eager=True, max_model_len=2048, seed=0)
    probe = kernels.install(
        ProbeConfig(
            sample_rate=1.0,
            record=True,
            publish=False,
            p_values=(p,),
            nvtx=False,
            integrations=("transformers",),
        )
    )
    probe.ensure_integration("vllm", lambda pr: vllm_plugin.install(pr, only_if_imported=False))
    probe.records.clear()
    llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1, temperature=0))
    from_vllm = by_layer(probe.records, len(ids), p)
    internal = probe.internal_errors
    from kcops.kernels import paged_kc

    layouts = {cls.__name__: name for cls, name in paged_kc._layout_of.items()}
    probe.records.clear()
    model = AutoModelForCausalLM.from_pretrained(
        folder, attn_implementation="eager", dtype=torch.float32
    )
    with torch.no_grad():
        model(torch.tensor([ids]))
    from_hf = by_layer(probe.records, len(ids), p)
    print(json.dumps({"tokens": len(ids), "vllm": from_vllm, "transformers": from_hf,
                      "internal_errors": internal, "layouts": layouts}))  # fmt: skip


if __name__ == "__main__":
    main()
