"""`make soak`: a real agent under steady light load for 10 minutes; RSS growth from minute 2.

Not a test (CI does not run it): prints RSS each minute and exits 1 when RSS grew more
than 5% from minute 2 to the end. Load: 8 probe processes sending one frame a second
each (30 layers, all histograms), /metrics and /api/v1/status read every second, and
an Alertmanager webhook batch every 10 seconds.

The store keeps ``--retention-s`` (60 s here, 1 h by default): with the default,
~1,500 series at a 0.2 s tick add ~7 MiB of samples a minute for an hour by
design (bounded by ``store.max_bytes``), which would hide a leak. With a minute's
retention the store is full by minute 2, so growth after it is a leak.

Run: PYTHONPATH=. .venv/bin/python -m tests.faults.soak [--minutes 10]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kcops.kernels import wire
from tests.faults.conftest import start_agent, stop_agent
from tests.unit.kernels.test_wire import sample_frame


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    ap.add_argument("--duration", help="how long, as 30m or 1800s (overrides --minutes)")
    ap.add_argument(
        "--from-minute",
        type=int,
        help="growth is measured from this minute to the end (default 2; 10 for 20 min or more)",
    )
    ap.add_argument(
        "--max-growth",
        type=float,
        help="allowed growth (default 0.05 from minute 2, 0.02 from minute 10: issue 24)",
    )
    ap.add_argument("--retention-s", type=float, default=60.0, help="the store's retention")
    args = ap.parse_args()
    if args.duration:
        from kcops.agent.duration import parse_duration

        try:
            args.minutes = parse_duration(args.duration) / 60
        except ValueError as exc:
            ap.error(f"--duration {args.duration!r}: {exc}")
    if args.minutes <= 0:
        ap.error("the soak needs a positive duration")
    if args.from_minute is None:
        args.from_minute = 10 if args.minutes >= 20 else 2
    if args.max_growth is None:
        args.max_growth = 0.02 if args.from_minute >= 10 else 0.05
    agent = start_agent(
        Path(tempfile.mkdtemp(prefix="kcops-soak-")),
        extra={"store": {"retention_s": args.retention_s}},
    )
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(agent.probe_socket))
    rss: dict[int, int] = {}
    seq = 0
    start = time.monotonic()
    try:
        while (elapsed := time.monotonic() - start) < args.minutes * 60:
            for p in range(8):
                f = sample_frame()
                f.pid, f.process, f.seq, f.instance = 100 + p, f"engine-{p}", seq, f"i{p}"
                f.calls_by_layer = {str(i): 3 for i in range(30)}
                sock.sendall(wire.encode(f))
            seq += 1
            httpx.get(agent.url + "/metrics", timeout=5)
            httpx.get(agent.url + "/api/v1/status", timeout=5)
            if seq % 10 == 0:
                alert = {"status": "firing", "labels": {"alertname": "SoakUnknown"}}
                httpx.post(agent.url + "/api/v1/alertmanager", headers=agent.headers(),
                           json={"version": "4", "alerts": [alert] * 20}, timeout=10)  # fmt: skip
            minute = int(elapsed // 60)
            if minute not in rss:
                rss[minute] = agent.rss_bytes()
                print(f"minute {minute:2d}: RSS {rss[minute] / 2**20:.1f} MiB", flush=True)
            time.sleep(max(0.0, seq - (time.monotonic() - start)))
        end = agent.rss_bytes()
    finally:
        sock.close()
        stop_agent(agent)
    base = rss.get(args.from_minute, rss[min(rss)])
    growth = (end - base) / base
    print(
        f"RSS growth from minute {args.from_minute} to the end: {growth * 100:+.1f}% "
        f"({base / 2**20:.1f} -> "
        f"{end / 2**20:.1f} MiB; goal <= {args.max_growth * 100:.0f}%)"
    )
    return 0 if growth <= args.max_growth else 1


if __name__ == "__main__":
    sys.exit(main())
