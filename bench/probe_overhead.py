"""Probe overhead on SmolLM2-135M: plain vs instrumented forward passes, side by side.

For each probe mode the script interleaves plain and instrumented passes
(plain, probe, plain, probe, … — the order alternates per pair so drift in the
machine's load hits both sides alike) over one fixed prompt and prints the
median of the per-pair time ratios instrumented / plain.

Modes:
- ``nvtx``: NVTX range, call counter and context length only (no sampling, no NaN check);
- ``default``: ``ProbeConfig()`` defaults (sampling, NaN/Inf check every call);
  ``--sample-rate R`` sets its sampling rate instead;
- ``every``: every call sampled (timing + K(C) of the last row).

``--decode`` times one decode step over the prompt's KV cache instead of the prefill.
The publisher runs with no agent listening (frames dropped), as in a pod whose
agent is down. Each timed step follows one untimed step under the same setting
(the probe's first calls after an install build its per-layer names and NVTX
attributes; a server pays that once), and a garbage collection (untimed) before
each side, so that the cycles left by earlier installs are never collected
inside a timed step.

    .venv/bin/python bench/probe_overhead.py --pairs 10 --tokens 512
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

MODES = ("nvtx", "default", "every")


def probe_config(mode: str, sample_rate: float | None = None) -> Any:
    """The mode's ProbeConfig; ``sample_rate`` replaces the default mode's rate."""
    from kcops.kernels import ProbeConfig

    common: dict[str, Any] = {"socket_path": "/nonexistent/kcops-bench.sock"}
    if mode == "nvtx":
        return ProbeConfig(sample_rate=0.0, check_every_call=False, **common)
    if mode == "default":
        if sample_rate is not None:
            common["sample_rate"] = sample_rate
        return ProbeConfig(**common)
    if mode == "every":
        return ProbeConfig(sample_rate=1.0, **common)
    raise ValueError(mode)


def prompt_ids(tok: Any, tokens: int) -> Any:
    from pydoc_data import topics

    text = "\n".join(topics.topics[k] for k in sorted(topics.topics))
    ids = tok(text, return_tensors="pt")["input_ids"][:, :tokens]
    if ids.shape[-1] < tokens:
        raise SystemExit(f"prompt has only {ids.shape[-1]} tokens")
    return ids


def make_step(model: Any, ids: Any, decode: bool) -> Callable[[], None]:
    import torch

    if not decode:

        def prefill() -> None:
            with torch.no_grad():
                model(ids)

        return prefill
    with torch.no_grad():
        out = model(ids, use_cache=True)
    cache = out.past_key_values
    nxt = out.logits[:, -1:].argmax(-1)
    length = ids.shape[-1]

    def step() -> None:
        with torch.no_grad():
            model(nxt, cache=cache, use_cache=True)
        cache.crop(-(cache.get_seq_length() - length))  # drop the step just added

    return step


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = time.perf_counter


def timed(fn: Callable[[], None]) -> float:
    t0 = _clock()
    fn()
    return _clock() - t0


def run_mode(
    step: Callable[[], None], mode: str, pairs: int, sample_rate: float | None = None
) -> tuple[float, float, float, float]:
    """Median ratio (a typical step), ratio of the sums (the expected cost, sampled calls
    included), median plain seconds, median instrumented seconds."""
    import kcops.kernels as kernels

    ratios: list[float] = []
    plain: list[float] = []
    inst: list[float] = []
    for i in range(pairs):
        # A new seed per pair: with one seed every install samples the same call indices,
        # so a timed step would hold a sampled call always or never (seed 0: call 40).
        cfg = dataclasses.replace(probe_config(mode, sample_rate), seed=i)
        order = (False, True) if i % 2 == 0 else (True, False)
        times: dict[bool, float] = {}
        for instrumented in order:
            # The probes of earlier pairs are reference cycles (probe -> publisher -> its
            # bound before_flush); collect them here, untimed, so that a full collection of
            # this process (~0.2 s unfrozen, 2-3 decode steps) never lands in a timed step.
            gc.collect()
            if instrumented:
                kernels.install(cfg)
            try:
                # One untimed step first, on both sides: a fresh install builds its NVTX
                # attributes, names and wrappers on its first calls, which a server pays
                # once at start, not on every decode step.
                step()
                times[instrumented] = timed(step)
            finally:
                kernels.uninstall()
        plain.append(times[False])
        inst.append(times[True])
        ratios.append(times[True] / times[False])
    return (
        statistics.median(ratios),
        sum(inst) / sum(plain),
        statistics.median(plain),
        statistics.median(inst),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="tiny, smollm2 or a local HF folder")
    ap.add_argument("--pairs", type=int, default=10, help="plain/instrumented pairs per mode")
    ap.add_argument("--tokens", type=int, default=512, help="prompt length (>= 512 for the goal)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--decode", action="store_true", help="time a decode step, not the prefill")
    ap.add_argument("--attn", default="sdpa", help="transformers attention implementation")
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall: perf_counter; cpu: process CPU time (steadier on a shared, loaded machine)",
    )
    ap.add_argument("--device", default="cpu", help="torch device of the model: cpu, cuda")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    ap.add_argument(
        "--sample-rate",
        type=float,
        default=None,
        help="sample_rate of the 'default' mode (0..1; default: ProbeConfig's)",
    )
    args = ap.parse_args(argv)
    if args.sample_rate is not None and not 0.0 <= args.sample_rate <= 1.0:
        ap.error(f"--sample-rate {args.sample_rate}: allowed 0..1")
    if args.pairs < 10:
        print("note: fewer than 10 pairs", file=sys.stderr)

    global _clock
    _clock = CLOCKS[args.clock]

    import torch

    from kcops.worker.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, progress=False, attn_implementation=args.attn)
    model.to(args.device)
    ids = prompt_ids(tok, args.tokens).to(args.device)
    if args.device.startswith("cuda"):
        host_clock = _clock

        def synced() -> float:  # kernels run asynchronously: time them, not their launch
            torch.cuda.synchronize()
            return host_clock()

        _clock = synced
    step = make_step(model, ids, args.decode)
    for _ in range(2):  # warm-up: allocator, kernels, lazy imports of the probe
        step()
    import kcops.kernels as kernels

    kernels.install(probe_config("every"))
    step()
    kernels.uninstall()
    # Everything alive now (model, torch, transformers: ~350k objects) is moved out of the
    # collector's sight, so that the collection before each timed side costs milliseconds.
    gc.collect()
    gc.freeze()

    what = "decode step" if args.decode else "prefill"
    print(
        f"model={args.model} attn={args.attn} device={args.device} tokens={ids.shape[-1]} "
        f"{what} pairs={args.pairs} threads={torch.get_num_threads()} clock={args.clock} "
        f"default sample_rate={probe_config('default', args.sample_rate).sample_rate}"
    )
    print(f"{'mode':<8} {'median ratio':>12} {'mean ratio':>10} {'plain s':>9} {'probe s':>9}")
    for mode in args.modes.split(","):
        ratio, mean, plain, inst = run_mode(step, mode.strip(), args.pairs, args.sample_rate)
        print(f"{mode:<8} {ratio:>12.4f} {mean:>10.4f} {plain:>9.4f} {inst:>9.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
