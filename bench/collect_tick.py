"""Cost of one full collection tick, as a share of the 1 s tick, and of receiving probe frames.

Setup (all on 127.0.0.1, nothing mocked below the collector interface except NVML):

- NVML: the fake pynvml of the unit tests with 8 GPUs (every field, XID event set,
  per-process memory of the engine pids every 10 s off the loop);
- engine: a real HTTP server (another thread) serving a ~330-series vLLM exposition
  (tests/fixtures/vllm_metrics.txt) in which a quarter of the sample lines change
  from one scrape to the next (a busy engine), fetched and mapped each tick, plus /health;
- probe: 10,000 frames a second sent by another process over the agent's stream socket
  through the probe's own ``StreamSender`` (every ``--kc-every``-th frame with K(C) by
  layer, as the probe sends), received on the agent's loop;
- process, engine events and CPU device memory of a real child process tree.

Measured with ``time.thread_time()`` on the loop thread, which does all receiving (no
other thread of the agent receives anything; the CPU of the process's other threads,
the fake engine's HTTP server and asyncio's executor, is printed beside it), and
``time.perf_counter()`` (wall time of ``CollectorRunner.tick``). Prints medians.

Also the decode cost of one frame, with and without K(C) by layer (``time.thread_time``,
best of 15 repeats).

Run: .venv/bin/python bench/collect_tick.py [--frames-per-s 10000] [--ticks 10]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kcops.agent.collectors.base import CollectorRunner  # noqa: E402
from kcops.agent.collectors.cpumem import CpuDeviceMemoryCollector  # noqa: E402
from kcops.agent.collectors.engine_http import EngineClient  # noqa: E402
from kcops.agent.collectors.health import HealthCollector  # noqa: E402
from kcops.agent.collectors.nvml import Nvml, NvmlCollector  # noqa: E402
from kcops.agent.collectors.probe import ProbeReceiver  # noqa: E402
from kcops.agent.collectors.process import EngineEventsCollector, ProcessCollector  # noqa: E402
from kcops.agent.collectors.procwatch import EngineWatch  # noqa: E402
from kcops.agent.collectors.scrape import EngineScrapeCollector  # noqa: E402
from kcops.agent.engine.pid import EnginePid  # noqa: E402
from kcops.agent.signals import register_all  # noqa: E402
from kcops.agent.store import Store  # noqa: E402
from kcops.kernels import wire  # noqa: E402
from tests.unit.collectors.fake_pynvml import FakeNvmlModule, ProcessInfo  # noqa: E402

EXPOSITION = (REPO / "tests" / "fixtures" / "vllm_metrics.txt").read_bytes()


def _variants(n: int = 16, share: float = 0.25) -> list[bytes]:
    """Pages as a busy engine serves them: ~``share`` of the sample lines change each scrape."""
    rng = random.Random(7)
    lines = EXPOSITION.decode().split("\n")
    out = []
    for _ in range(n):
        out.append(
            "\n".join(
                f"{ln}{rng.randint(1, 9)}" if ln and ln[0] != "#" and rng.random() < share else ln
                for ln in lines
            ).encode()
        )
    return out


PAGES = _variants()

SENDER = r"""
import sys, time
sys.path.insert(0, {repo!r})
from kcops.kernels import wire
from kcops.kernels.sender import Sent, StreamSender
path, per_s, seconds, layers = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
kc_every = int(sys.argv[5])
def frame(seq):
    f = wire.Frame(pid=4242, process="engine", seq=seq, instance="bench",
                   calls_by_layer={{str(i): 3 for i in range(layers)}})
    if layers > 1:
        for name in wire.PLAIN_HISTOGRAMS:
            if name == wire.KC_TOKENS:
                continue  # K(C) goes by layer
            h = wire.Histogram.of(name); h.observe(0.3); h.observe(100); f.histograms[name] = h
        for n in (16, 32, 64):
            h = wire.Histogram.of(wire.TOPN_MASS); h.observe(0.9); f.topn_mass[n] = h
        if seq % kc_every == kc_every - 1:
            for i in range(layers):
                h = wire.Histogram.of(wire.KC_TOKENS); h.observe(100); f.kc_by_layer[str(i)] = h
            f.kc_by_layer["0"].observe(0.3)
    return wire.encode(f)
frames = [frame(i) for i in range(100)]
sender = StreamSender(path)  # what the probe does: one connection, non-blocking, drop when full
start = time.monotonic(); sent = dropped = 0
while time.monotonic() - start < seconds:
    due = int((time.monotonic() - start) * per_s)
    while sent + dropped < due:
        if sender.send(frames[(sent + dropped) % 100]) is not Sent.DROPPED:
            sent += 1
        else:
            dropped += 1
    time.sleep(0.001)
print(sent, dropped, sum(map(len, frames)) // len(frames))
"""


class Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's uvicorn does
    served = 0

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/health":
            body = b"{}"
        else:
            Engine.served += 1
            body = PAGES[Engine.served % len(PAGES)]
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def bench_frame(layers: int, kc_layers: bool = False) -> wire.Frame:
    f = wire.Frame(pid=4242, process="engine", seq=1, instance="bench",
                   calls_by_layer={str(i): 3 for i in range(layers)})  # fmt: skip
    for name in wire.PLAIN_HISTOGRAMS:
        h = wire.Histogram.of(name)
        h.observe(0.3)
        h.observe(100)
        f.histograms[name] = h
    for n in (16, 32, 64):
        h = wire.Histogram.of(wire.TOPN_MASS)
        h.observe(0.9)
        f.topn_mass[n] = h
    if kc_layers:
        del f.histograms[wire.KC_TOKENS]
        for i in range(layers):
            h = wire.Histogram.of(wire.KC_TOKENS)
            h.observe(100)
            f.kc_by_layer[str(i)] = h
    return f


def decode_us(layers: int) -> dict[str, float]:
    """CPU microseconds to decode one frame (``wire.decode``; the receiver's bulk path
    skips most of it for frames of a shape seen before)."""
    import timeit

    datas = {
        "a frame": wire.encode(bench_frame(layers)),
        "with K(C) by layer": wire.encode(bench_frame(layers, kc_layers=True)),
    }
    out = {}
    for name, data in datas.items():
        t = timeit.Timer(lambda d=data: wire.decode(d), timer=time.thread_time)  # type: ignore[misc]
        out[name] = min(t.repeat(number=2000, repeat=15)) / 2000 * 1e6
    return out


def _other_threads_cpu_s() -> float:
    """CPU of this process's threads other than the calling one (the fake engine's HTTP
    server, asyncio's executor): nothing of the receiver runs there, and this shows it."""
    me = threading.get_ident()
    total = 0.0
    for t in threading.enumerate():
        if t.ident is not None and t.ident != me:
            with contextlib.suppress(OSError, ValueError):
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return total


async def run(
    frames_per_s: int,
    ticks: int,
    layers: int,
    max_frames_per_s: int,
    kc_every: int,
    max_receive_ms: float,
) -> dict[str, float]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    tmp = Path(tempfile.mkdtemp())
    sock = tmp / "probe.sock"
    try:
        fake = FakeNvmlModule(gpus=8)
        for g in fake.gpus:
            g.procs = [ProcessInfo(child.pid, 1 << 30)]
        pids = EnginePid(pid=child.pid)
        watch = EngineWatch(pids, kmsg_path=None)
        client = EngineClient(f"http://127.0.0.1:{srv.server_address[1]}", timeout_s=0.5, pids=pids)
        probe = ProbeReceiver(
            sock, max_frames_per_s=max_frames_per_s, max_receive_ms_per_s=max_receive_ms
        )
        collectors = [
            probe,
            NvmlCollector(Nvml(fake), engine_pids=watch.pid_set),
            ProcessCollector(watch),
            EngineEventsCollector(watch),
            CpuDeviceMemoryCollector(watch),
            HealthCollector(client),
            EngineScrapeCollector(client, "auto"),
        ]
        store = Store()
        register_all(store)
        runner = CollectorRunner(store, collectors)
        await runner.start()
        await runner.tick(0.0)  # warm-up: connections, adapter detection, device discovery

        sender = subprocess.Popen(
            [
                sys.executable,
                "-c",
                SENDER.format(repo=str(REPO)),
                str(sock),
                str(frames_per_s),
                str(ticks + 0.5),
                str(layers),
                str(kc_every),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        wall, cpu_tick, cpu_total, probe_s, others = [], [], [], [], []
        drains0, others0 = probe.stream.drains, _other_threads_cpu_s()
        for i in range(1, ticks + 1):
            c0 = time.thread_time()
            w0 = time.perf_counter()
            await runner.tick(float(i))
            w1 = time.perf_counter()
            c1 = time.thread_time()
            wall.append(w1 - w0)
            cpu_tick.append(c1 - c0)
            probe_s.append(runner.health["probe"].last_duration_s)
            # the rest of the second: the loop receives probe frames
            await asyncio.sleep(max(0.0, 1.0 - (w1 - w0)))
            cpu_total.append(time.thread_time() - c0)
            o = _other_threads_cpu_s()
            others.append(o - others0)
            others0 = o
        drains = probe.stream.drains - drains0
        loop = asyncio.get_running_loop()
        sent_line = (await loop.run_in_executor(None, sender.communicate))[0].split()
        await asyncio.sleep(0.2)
        await client.stop()
        await runner.stop()
        frames_ok = probe.frames["ok"]
        series = len(store)
        health = {n: h.last_error for n, h in runner.health.items() if not h.ok}
        if health:
            print("collector errors:", health, file=sys.stderr)
        return {
            "tick_wall_ms": statistics.median(wall) * 1e3,
            "tick_cpu_ms": statistics.median(cpu_tick) * 1e3,
            "probe_collect_ms": statistics.median(probe_s) * 1e3,
            "loop_cpu_total_ms": sum(cpu_total) * 1e3,
            "tick_cpu_total_ms": sum(cpu_tick) * 1e3,
            "loop_cpu_per_s_ms": statistics.median(cpu_total) * 1e3,
            "frames_sent": float(sent_line[0]),
            "frames_dropped": float(sent_line[1]),
            "frame_bytes": float(sent_line[2]),
            "frames_received": float(frames_ok),
            "frames_shed": float(probe.frames["shed"]),
            "series": float(series),
            "drains_per_s": drains / ticks,
            "paused": float(probe.budget.pauses),
            "other_threads_ms_per_s": statistics.median(others) * 1e3,
        }
    finally:
        child.kill()
        child.wait()
        srv.shutdown()


def at_rate_ms(r: dict[str, float], frames_per_s: int) -> float:
    """Loop CPU a second at the offered rate: the tick plus the measured cost a frame
    received times the frames offered (equal to the measured figure when none dropped)."""
    per_frame_ms = (r["loop_cpu_total_ms"] - r["tick_cpu_total_ms"]) / max(
        1.0, r["frames_received"]
    )
    return r["tick_cpu_ms"] + per_frame_ms * frames_per_s


def report(r: dict[str, float], args: argparse.Namespace) -> None:
    kc = f", K(C) by layer in every {args.kc_every}th frame"
    print(
        f"collect_tick (stream socket): 8 fake GPUs, {r['series']:.0f} series in store, "
        f"vLLM exposition {len(EXPOSITION)} bytes, probe {args.frames_per_s} frames/s "
        f"({r['frame_bytes']:.0f} B mean, {args.layers} layers{kc}), {args.ticks} ticks"
    )
    print(
        f"  tick (collectors only)  wall {r['tick_wall_ms']:.2f} ms   cpu {r['tick_cpu_ms']:.2f} ms"
        f"   = {r['tick_cpu_ms'] / 10:.2f}% of a 1 s tick (frames received meanwhile included)"
    )
    received_per_s = r["frames_received"] / args.ticks
    print(
        f"  loop thread per second  cpu {r['loop_cpu_per_s_ms']:.1f} ms"
        f"   = {r['loop_cpu_per_s_ms'] / 10:.1f}% of a core (tick + {received_per_s:.0f} frames/s"
        f" received; {r['drains_per_s']:.0f} stream reads/s); other threads of the process "
        f"(fake engine, executor; no receiving) {r['other_threads_ms_per_s']:.1f} ms"
    )
    per_frame_us = (
        (r["loop_cpu_total_ms"] - r["tick_cpu_total_ms"]) * 1e3 / max(1.0, r["frames_received"])
    )
    print(
        f"  probe collector per tick wall {r['probe_collect_ms']:.2f} ms"
        f" = {r['probe_collect_ms'] / 10:.2f}% of a tick; receiving costs {per_frame_us:.1f} us "
        f"CPU a frame: at {args.frames_per_s}/s the loop needs "
        f"{at_rate_ms(r, args.frames_per_s) / 10:.1f}% of a core"
    )
    offered = r["frames_sent"] + r["frames_dropped"]
    print(
        f"  probe frames            offered {offered:.0f}, sent {r['frames_sent']:.0f}, "
        f"dropped at the sender (receiver busy) {r['frames_dropped']:.0f}, "
        f"received {r['frames_received']:.0f}, shed {r['frames_shed']:.0f}; reading paused in "
        f"{r['paused']:.0f} s of {args.ticks} (max_receive_ms_per_s spent)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames-per-s", type=int, default=10_000)
    ap.add_argument("--ticks", type=int, default=10)
    ap.add_argument("--layers", type=int, default=30, help="layers per frame (1: minimal frames)")
    ap.add_argument(
        "--max-frames-per-s",
        type=int,
        default=1_000_000,
        help="the receiver's shedding limit (agent default 2000; default here: no shedding)",
    )
    ap.add_argument(
        "--max-receive-ms-per-s",
        type=float,
        default=1000.0,
        help="the receiver's time budget (agent default 250; default here: the whole second)",
    )
    ap.add_argument(
        "--kc-every", type=int, default=10,
        help="K(C) by layer in every Nth frame (the probe's default: 10 s at 1 s flushes)",
    )  # fmt: skip
    args = ap.parse_args()
    costs = decode_us(args.layers)
    print(
        f"decode one frame ({args.layers} layers, 7 histograms; wire.decode): "
        + ", ".join(f"{k} {v:.1f} us" for k, v in costs.items())
    )
    r = asyncio.run(
        run(
            args.frames_per_s, args.ticks, args.layers, args.max_frames_per_s, args.kc_every,
            args.max_receive_ms_per_s,
        )
    )  # fmt: skip
    report(r, args)


if __name__ == "__main__":
    main()
