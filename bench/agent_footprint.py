"""Idle footprint of a running agent: RSS and CPU per tick, over >= 60 ticks.

    .venv/bin/python bench/agent_footprint.py [--ticks 60] [--tick 1.0]

Starts `kcops agent run` as a real process with the default collectors, lets
it warm up, then samples its RSS and CPU time with psutil over the window.
Prints CPU per tick as a share of the tick (a ratio, not a bare time).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.services import free_port, kcops_bin, wait_http  # noqa: E402


def ticks(base: str) -> int:
    return int(httpx.get(base + "/api/v1/status", timeout=5).json()["ticks"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ticks", type=int, default=60, help="ticks to measure over (>= 60)")
    ap.add_argument("--tick", type=float, default=1.0, help="agent tick in seconds")
    ap.add_argument("--warmup", type=int, default=5, help="ticks to skip first")
    ap.add_argument(
        "--engine-url",
        help="configure an engine URL (nothing needs to answer there): the agent then "
        "loads its HTTP client and polls it every tick",
    )
    args = ap.parse_args()
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        cmd = [
            kcops_bin(),
            "agent",
            "run",
            "--listen",
            f"127.0.0.1:{port}",
            "--state-dir",
            state,
            "--tick",
            str(args.tick),
            *(["--engine-url", args.engine_url] if args.engine_url else []),
        ]
        proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(base + "/healthz", 60, proc)
            while ticks(base) < args.warmup:
                time.sleep(args.tick / 4)
            p = psutil.Process(proc.pid)
            t0, cpu0 = ticks(base), sum(p.cpu_times()[:2])
            rss_max = 0
            while ticks(base) < t0 + args.ticks:
                rss_max = max(rss_max, p.memory_info().rss)
                time.sleep(args.tick / 2)
            t1, cpu1 = ticks(base), sum(p.cpu_times()[:2])
            rss = p.memory_info().rss
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
    n = t1 - t0
    cpu_per_tick = (cpu1 - cpu0) / n
    print(f"ticks measured         {n} (tick {args.tick}s)")
    print(f"idle RSS               {rss / 2**20:.1f} MiB (max {rss_max / 2**20:.1f} MiB)")
    print(f"CPU per tick           {cpu_per_tick * 1000:.2f} ms")
    print(f"CPU share of the tick  {cpu_per_tick / args.tick:.4f}")
    print("(the status polls of this benchmark are counted in the agent's CPU: an upper bound)")


if __name__ == "__main__":
    main()
