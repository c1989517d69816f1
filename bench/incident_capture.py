"""Incident capture: stall-to-serving with the evidence captured before the restart and
without it, side by side in one run (issue 38: at most 2 s more with capture on).

Each run starts a supervised reference worker (`kcops serve --model tiny --enable-faults`)
under an agent with its shipped rules and defaults (enforce mode), except
``incidents.capture_budget_s``: the budget (default 2 s) or 0 (capture off). It stalls the
worker's loop (fault ``{"stall": true}``: /health and /metrics still answer, three
requests wait) and polls every 0.25 s: the first firing ``severity: page`` alert, the
``restart_worker`` audit record and a short completion; "serving again" is the first
completion answered after the restart was recorded (the old worker is stalled, then
killed: only the new one answers). Every run is a fresh agent (restart_worker's cooldown
is per agent); the two settings alternate (on, off / off, on, ...) so a drift of the
machine falls on both.

    .venv/bin/python bench/incident_capture.py [--rounds 3] [--budget 2] [--timeout 120]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.recovery import _first_page, _restart, _serves, _until  # noqa: E402
from tests.services import free_port, kcops_bin, running, wait_http  # noqa: E402

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
POLL_S = 0.25
PENDING = 3


@dataclass
class Run:
    budget_s: float
    page: float | None = None
    restart: float | None = None
    serving: float | None = None
    capture_s: float | None = None
    missing: str = ""
    incident: str = ""


@contextlib.contextmanager
def pending(url: str, n: int = PENDING) -> Iterator[None]:
    """``n`` completions in flight: they wait in the stalled worker's queue."""

    def one(i: int) -> None:
        with contextlib.suppress(httpx.HTTPError):
            body = {"model": "tiny", "prompt": f"pending {i} " * 10, "max_tokens": 8}
            httpx.post(f"{url}/v1/completions", json=body, timeout=120)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    yield


def incident_of(state: Path) -> dict[str, object] | None:
    """The first incident's manifest (one stall per run: one incident)."""
    for manifest in sorted((state / "incidents").glob("*/incident.json")):
        with contextlib.suppress(OSError, ValueError):
            return dict(json.loads(manifest.read_text()))
    return None


def one_run(tmp: Path, budget_s: float, n: int, timeout: float) -> Run:
    wport, aport = free_port(), free_port()
    worker, agent = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{aport}"
    name = f"run{n}-budget{budget_s:g}"
    state = tmp / f"{name}-state"
    config = tmp / f"{name}.yaml"
    config.write_text(f"incidents: {{capture_budget_s: {budget_s:g}}}\n")
    env = {"KCOPS_TOKEN": TOKEN, "KCOPS_PROBE_SOCKET": str(tmp / f"{name}-probe.sock")}
    cmd = [kcops_bin(), "agent", "run", "--mode", "enforce", "--config", str(config),
           "--listen", f"127.0.0.1:{aport}", "--state-dir", str(state), "--engine-url", worker,
           "--engine-adapter", "kcops", "--",
           kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--enable-faults",
           "--threads", "1"]  # fmt: skip
    run = Run(budget_s)
    with running(cmd, log_path=tmp / f"{name}-agent.log", env=env) as proc:
        wait_http(f"{agent}/readyz", 120, proc)
        wait_http(f"{worker}/health", 120, proc)
        ready = f"{agent}/api/v1/engine/ready"
        _until(lambda: httpx.get(ready, timeout=2).status_code == 200 and _serves(worker, "tiny"),
               120, "worker ready")  # fmt: skip
        r = httpx.post(f"{worker}/admin/faults", json={"stall": True}, headers=AUTH, timeout=10)
        r.raise_for_status()
        t0 = time.monotonic()
        deadline = t0 + timeout
        with pending(worker):
            while time.monotonic() < deadline:
                now = time.monotonic() - t0
                if run.page is None and _first_page(agent):
                    run.page = now
                if run.restart is None and _restart(state):
                    run.restart = now
                if run.restart is not None and _serves(worker, "tiny"):
                    run.serving = time.monotonic() - t0
                    break
                time.sleep(POLL_S)
        inc = incident_of(state)
        cap = inc.get("capture") if inc else None
        if inc is not None:
            run.incident = str(inc["id"])
        if isinstance(cap, dict):
            run.capture_s = float(cap["seconds"])
            run.missing = "; ".join(str(m) for m in cap.get("missing") or [])
    return run


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f}"


def report(pairs: list[tuple[Run, Run]]) -> None:
    print("\nseconds from the stall; capture on (budget) beside capture off (0) in each round;")
    print("restart: restart_worker recorded (the old worker killed, the new one spawned)")
    print(f"{'round':<7}{'order':<8}{'page on':>8}{'off':>6}{'restart on':>11}{'off':>6}"
          f"{'serve on':>9}{'off':>7}{'on - off':>9}{'on / off':>9}{'capture':>8}")  # fmt: skip
    diffs, ratios = [], []
    for i, (on, off) in enumerate(pairs, 1):
        order = "on,off" if i % 2 else "off,on"
        diff = ratio = None
        if on.serving is not None and off.serving is not None:
            diff, ratio = on.serving - off.serving, on.serving / off.serving
            diffs.append(diff)
            ratios.append(ratio)
        print(f"{i:<7}{order:<8}{_s(on.page):>8}{_s(off.page):>6}{_s(on.restart):>11}"
              f"{_s(off.restart):>6}{_s(on.serving):>9}{_s(off.serving):>7}{_s(diff):>9}"
              f"{_s(ratio):>9}{_s(on.capture_s):>8}")  # fmt: skip
    if diffs:
        print(f"median: serving again on - off {statistics.median(diffs):+.2f} s, on / off "
              f"{statistics.median(ratios):.2f}x over {len(diffs)} pairs")  # fmt: skip
    kills = [on.restart - off.restart for on, off in pairs if on.restart and off.restart]
    if kills:
        print(f"median: restart recorded on - off {statistics.median(kills):+.2f} s")
    for on, off in pairs:
        for r in (on, off):
            if r.missing:
                print(f"  incident {r.incident} (budget {r.budget_s:g} s) missing: {r.missing}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="pairs of runs (on and off)")
    ap.add_argument("--budget", type=float, default=2.0, help="capture_budget_s of the 'on' runs")
    ap.add_argument("--timeout", type=float, default=120.0, help="per run, seconds")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kcops-incident-capture-"))
    pairs = []
    for i in range(args.rounds):
        budgets = (args.budget, 0.0) if i % 2 == 0 else (0.0, args.budget)
        runs = {b: one_run(tmp, b, 2 * i + k, args.timeout) for k, b in enumerate(budgets)}
        pairs.append((runs[args.budget], runs[0.0]))
        on, off = pairs[-1]
        print(f"round {i + 1}: serving again after {_s(on.serving)} s with capture "
              f"({_s(on.capture_s)} s of it), {_s(off.serving)} s without", flush=True)  # fmt: skip
    report(pairs)
    print(f"\nlogs: {tmp}")
    return 0 if all(r.serving is not None for p in pairs for r in p) else 1


if __name__ == "__main__":
    sys.exit(main())
