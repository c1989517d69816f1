"""The probe's part of a tick after a flood of 1,000 sources (tests/faults/test_flood.py's
flood: 300 layers each, calls and K(C)), side by side in one run:

- ``rebuilt``: every process's samples built again each tick (as before a quiet process
  gave its list again);
- ``cached``: the receiver as it is: a process with no frame since the last tick gives
  the same samples.

Both write into a real ``Store`` at its defaults (50,000 series: most of the flood's
133,646 series a tick are refused, counted by source). Prints the median CPU time of
``collect`` + ``Store.write`` per tick and the ratio, rebuilt / cached, pair by pair.

Run: .venv/bin/python bench/flood_tick.py [--sources 1000] [--layers 300] [--pairs 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kcops.agent.collectors.probe import ProbeReceiver
from kcops.agent.quotas import probe_source
from kcops.agent.store import Store
from kcops.kernels import wire


def frame(i: int, layers: int) -> bytes:
    kc = wire.Histogram.of(wire.KC_TOKENS)
    kc.observe(100)
    return wire.encode(
        wire.Frame(
            pid=10_000 + i,
            process=f"flood-{i}",
            seq=0,
            engine="flood",
            calls_by_layer={f"layer-{j}": 1 for j in range(layers)},
            kc_by_layer={f"layer-{j}": kc for j in range(layers)},
        )
    )


def tick(r: ProbeReceiver, store: Store, now: float, rebuild: bool) -> float:
    if rebuild:
        for p in r.sums.procs.values():
            p.out = None
    t0 = time.thread_time()
    store.write(r.collect(now), now, probe_source)
    return time.thread_time() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=int, default=1000)
    ap.add_argument("--layers", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=7)
    args = ap.parse_args()
    store = Store()
    r = ProbeReceiver(
        "/nonexistent/probe.sock", max_frames_per_s=1 << 30, series_share=store.max_series // 32
    )
    r._consume(b"".join(frame(i, args.layers) for i in range(args.sources)))
    now = 1000.0
    for _ in range(2):  # the store fills, the caches warm
        tick(r, store, now, rebuild=True)
        now += 1.0
    ratios, cpu = [], {"rebuilt": [], "cached": []}
    for _ in range(args.pairs):
        a = tick(r, store, now, rebuild=True)
        b = tick(r, store, now + 0.5, rebuild=False)
        now += 1.0
        cpu["rebuilt"].append(a)
        cpu["cached"].append(b)
        ratios.append(a / b)
    n = len(r.sums.procs)
    print(f"{args.sources} sources x {args.layers} layers; {n} process slots; store {len(store)}")
    for k, v in cpu.items():
        print(f"  {k:8s} median CPU per tick {statistics.median(v) * 1000:7.1f} ms")
    print(f"  rebuilt / cached, pair by pair: median {statistics.median(ratios):.2f}x "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
