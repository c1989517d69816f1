"""Idle footprint of a running agent: RSS and CPU per tick, over >= 60 ticks.

    .venv/bin/python bench/agent_footprint.py [--ticks 60] [--tick 1.0] [--kubernetes]

Starts `kcops agent run` as a real process with the default collectors, lets
it warm up, then samples its RSS and CPU time with psutil over the window.
Prints CPU per tick as a share of the tick (a ratio, not a bare time).

``--kubernetes``: the agent as deploy/ configures it (enforce, fleet lease on
a Kubernetes Lease, the HPA), talking to the stand-in API server of
tests/unit/kube on 127.0.0.1: its fleet-hold check loads kubernetes_asyncio
on the first tick and reads the HPA every 30 s, as in a pod.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.services import free_port, kcops_bin, wait_http  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterator


@contextlib.contextmanager
def api_server(token: str) -> Iterator[str]:
    """The stand-in Kubernetes API (tests/unit/kube/apiserver.py) in a thread."""
    from tests.unit.kube.apiserver import ApiServer, shipped_lease
    from tests.unit.kube.test_kube_client import HPA, HPA_PATH, LEASE_PATH

    api = ApiServer(token=token)
    api.put(HPA_PATH, HPA)
    api.put(LEASE_PATH, shipped_lease())
    loop = asyncio.new_event_loop()
    started: list[str] = []
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        started.append(loop.run_until_complete(api.start()))
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    ready.wait(30)
    try:
        yield started[0]
    finally:
        asyncio.run_coroutine_threadsafe(api.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
    print(f"API requests served    {len(api.requests)}")


def kube_config(state: str, url: str) -> Path:
    token = Path(state) / "sa-token"
    token.write_text("sa-token-1\n")
    cfg = Path(state) / "agent.yaml"
    cfg.write_text(
        "actions:\n"
        "  mode: enforce\n"
        "  restart: {mode: kubernetes}\n"
        f"  kubernetes: {{api_url: '{url}', token_file: '{token}', ca_file: null,\n"
        "               namespace: serving, pod_name: llm-serving-7d9f-abcde}\n"
        "  scale: {hpa: llm-serving, max_replicas: 8,\n"
        "          lease: {backend: kubernetes, name: kcops-fleet-scale-out}}\n"
    )
    return cfg


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
    ap.add_argument(
        "--kubernetes",
        action="store_true",
        help="configure the agent as deploy/ does, against a stand-in API server",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as state, contextlib.ExitStack() as stack:
        extra: list[str] = []
        if args.kubernetes:
            url = stack.enter_context(api_server("sa-token-1"))
            extra = ["--config", str(kube_config(state, url))]
        measure(args, state, extra)


def measure(args: argparse.Namespace, state: str, extra: list[str]) -> None:
    port = free_port()
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
        *extra,
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
