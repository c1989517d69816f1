"""The probe socket's bounds hold whatever the process names (issue 41, items 3 and 4): one
tenant label set per engine and model however process names rotate, and no connection
(peer pid) can fill the process slots; the engine the agent supervises always has one.
The real receiver over a real Unix socket; floods from other processes (other peer pids)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from kcops.agent.collectors.probe import ProbeReceiver
from kcops.agent.samples import Sample
from kcops.kernels import wire

# Forks N children (N peer pids); each connects, sends one frame under each of its K
# process names, and holds its connection until stdin closes.
FLOOD = """
import os, socket, sys
from kcops.kernels import wire
path, forks, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for k in range(forks):
    if os.fork() == 0:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        for j in range(names):
            f = wire.Frame(pid=os.getpid(), process=f"flood-{k}-{j}", seq=0, instance="a",
                           engine="vllm", calls_by_layer={"0": 1})
            s.sendall(wire.encode(f))
        sys.stdin.read()
        os._exit(0)
sys.stdin.read()
"""


def request_frame(process: str, tenant: str) -> bytes:
    h = wire.Histogram.of(wire.REQUEST_CONTEXT)
    h.observe(100)
    f = wire.Frame(pid=1, process=process, seq=0, instance="a", engine="vllm", model="m",
                   tenant=tenant, histograms={wire.REQUEST_CONTEXT: h})  # fmt: skip
    return wire.encode(f)


def engine_frame() -> bytes:
    f = wire.Frame(pid=os.getpid(), process="VLLM::Worker", seq=0, instance="a", engine="vllm",
                   calls_by_layer={"0": 1})  # fmt: skip
    return wire.encode(f)


async def until(cond: Callable[[], bool], what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while not cond():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.01)


def engines(out: list[Sample]) -> set[tuple[str, str]]:
    return {
        (d["engine"], d["process"])
        for s in out
        if s.name == "kcops_attention_calls_total" and (d := dict(s.labels))
    }


def test_rotating_process_names_keep_one_tenant_bound_per_engine_and_model(
    tmp_path: Path,
) -> None:
    """4 waves of 8 new process names, each sending 50 tenants of its own: the tenant
    values in the exported series stay within the cap (50) plus ``other``."""
    now = [100.0]
    path = tmp_path / "probe.sock"
    r = ProbeReceiver(path, max_processes=8, drain_interval_s=0.001, clock=lambda: now[0])
    seen: set[str] = set()

    async def main() -> None:
        await r.start()
        sent = 0
        for wave in range(4):
            data = b"".join(
                request_frame(f"w{wave}p{p}", f"w{wave}-p{p}-t{t}")
                for p in range(8)
                for t in range(50)
            )
            sent += 8 * 50
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(path))
                s.setblocking(False)
                await asyncio.get_running_loop().sock_sendall(s, data)
                await until(lambda n=sent: r.frames["ok"] >= n, f"{sent} frames")
            seen.update(
                dict(x.labels)["tenant"]
                for x in r.collect(now[0])
                if x.name == "kcops_request_context_tokens_count"
            )
            now[0] += 10  # the wave goes quiet; the next one takes its slots
        await r.stop()

    asyncio.run(main())
    assert len(seen) <= 50 + 1, f"{len(seen)} tenant values exported"


def _flood(path: Path, forks: int, names: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", FLOOD, str(path), str(forks), str(names)], stdin=subprocess.PIPE
    )


def _run(r: ProbeReceiver, path: Path, forks: int, names: int) -> list[Sample]:
    """A flood of ``forks`` peers x ``names`` process names, then this process's engine
    frame while the flood's connections stay open; the samples after it."""
    out: list[Sample] = []

    async def main() -> None:
        await r.start()
        flood = _flood(path, forks, names)
        try:
            await until(lambda: r.frames["ok"] >= forks * names, "the flood's frames")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(str(path))
                s.sendall(engine_frame())
                await until(lambda: r.frames["ok"] > forks * names, "the engine's frame")
            out.extend(r.collect(0.0))
        finally:
            assert flood.stdin is not None
            flood.stdin.close()
            flood.wait(30)
            await r.stop()

    asyncio.run(main())
    return out


def test_one_connection_cannot_fill_the_process_slots(tmp_path: Path) -> None:
    """One peer under 32 process names, each within its share: a new engine still gets a
    slot of its own (it was ``engine="other"`` until the flood stopped)."""
    path = tmp_path / "probe.sock"
    r = ProbeReceiver(
        path, max_processes=32, series_share=1000, drain_interval_s=0.001, clock=lambda: 100.0
    )  # the flood's frames never go quiet, however slow this machine is
    out = _run(r, path, forks=1, names=32)
    assert ("vllm", "VLLM::Worker") in engines(out), sorted(engines(out))


def test_the_supervised_engine_always_gets_a_slot(tmp_path: Path) -> None:
    """8 peers of 4 process names each fill all 32 slots, each within every bound; the
    process the agent supervises (its pid in the engine's tree) still gets one."""
    path = tmp_path / "probe.sock"
    r = ProbeReceiver(
        path, max_processes=32, series_share=1000, drain_interval_s=0.001,
        engine_pids=lambda: {os.getpid()}, clock=lambda: 100.0,
    )  # fmt: skip
    out = _run(r, path, forks=8, names=4)
    assert ("vllm", "VLLM::Worker") in engines(out), sorted(engines(out))
    assert len({p for _, p in engines(out)} - {"other"}) <= 32
