"""Probe overhead inside vLLM: generated tokens per second with the kcops probe off vs on,
same model, same load, interleaved in one process.

Run with the vLLM venv (`make test-vllm` builds it):

    .venv-vllm/bin/python bench/vllm_probe_overhead.py --model FOLDER [--pairs 4]
        [--requests 8] [--max-tokens 64] [--prompt-tokens 256] [--rates 0.003,1]

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, prefix caching off so
every round does the same work); its plugin is off and the probe is installed and
removed between rounds, so `off` and the probe at each of ``--rates`` (the share of calls
sampled for timing and K(C) from the paged KV cache; by default ``ProbeConfig()``'s 0.003
and 1, every call) alternate on the same engine; the order of the modes rotates from one
pair to the next, so none always runs first. Prints, per mode, the tokens/s of the whole
run (tokens of all its rounds over their time: the ratio of sums), the median and range of
its rounds, and the ratios to `off`; and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ["KCOPS_PROBE"] = "0"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _prompts(tokenizer: object, n: int, tokens: int) -> list[list[int]]:
    import pydoc_data.topics as topics

    texts = list(topics.topics.values())
    out = []
    for i in range(n):
        ids = tokenizer(texts[i % len(texts)] * 4)["input_ids"]  # type: ignore[operator]
        out.append(list(ids[:tokens]))
    return out


def _set_mode(mode: str) -> None:
    """``off``, or the probe sampling the share of calls ``mode`` names."""
    import kcops.kernels as kernels
    from kcops.kernels.config import ProbeConfig
    from kcops.kernels.integrations import vllm_plugin

    kernels.uninstall()
    if mode == "off":
        return
    rate = float(mode)
    cfg = ProbeConfig(sample_rate=rate, integrations=(), socket_path="/nonexistent/kcops.sock")
    probe = kernels.install(cfg)
    probe.ensure_integration("vllm", lambda p: vllm_plugin.install(p, only_if_imported=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="safetensors model folder")
    ap.add_argument("--pairs", type=int, default=4, help="rounds of each mode")
    ap.add_argument("--requests", type=int, default=8, help="requests per round (one batch)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--rates", default="0.003,1", help="sample rates beside off, comma-separated")
    args = ap.parse_args()
    modes = ("off", *(f"{float(r):g}" for r in args.rates.split(",")))

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tok = AutoTokenizer.from_pretrained(args.model)
    prompts = [{"prompt_token_ids": p} for p in _prompts(tok, args.requests, args.prompt_tokens)]
    llm = LLM(model=args.model, dtype="float32", enforce_eager=True, max_model_len=2048,
              enable_prefix_caching=False, seed=0)  # fmt: skip
    sp = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
    llm.generate(prompts, sp, use_tqdm=False)  # warm-up
    load_before = _loadavg()
    speeds: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, int] = dict.fromkeys(modes, 0)
    seconds: dict[str, float] = dict.fromkeys(modes, 0.0)
    for k in range(args.pairs):
        for mode in modes[k % len(modes) :] + modes[: k % len(modes)]:
            _set_mode(mode)
            t0 = time.perf_counter()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            dt = time.perf_counter() - t0
            n = sum(len(o.outputs[0].token_ids) for o in outs)
            tokens[mode] += n
            seconds[mode] += dt
            speeds[mode].append(n / dt)
            print(f"round {k} {mode:8s} {speeds[mode][-1]:8.1f} tok/s", flush=True)
    _set_mode("off")
    whole = {m: tokens[m] / seconds[m] for m in modes}
    med = {m: statistics.median(v) for m, v in speeds.items()}
    print(f"requests/round={args.requests} prompt_tokens={args.prompt_tokens} "
          f"max_tokens={args.max_tokens} pairs={args.pairs}")  # fmt: skip
    print(f"load average before: {load_before}; after: {_loadavg()}")
    for m in modes:
        spread = f"{min(speeds[m]):.1f}..{max(speeds[m]):.1f}"
        ratio, mratio = whole[m] / whole["off"], med[m] / med["off"]
        print(f"{m:8s} whole run {whole[m]:7.2f} tok/s (ratio to off {ratio:.3f})  "
              f"rounds: median {med[m]:7.2f} ({spread}), ratio {mratio:.3f}")  # fmt: skip


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as fh:
            return " ".join(fh.read().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
