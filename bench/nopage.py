"""No page and no action on a healthy engine: the stall and down alerts' false-positive check.

Issue 22's faster ``KcopsEngineStalled`` (for 2 s) and ``KcopsEngineDown`` (for 5 s)
must stay quiet while nothing is wrong. One agent (shipped rules and defaults,
enforce mode) supervises the reference worker (`kcops serve --model tiny`) through
three phases, back to back:

1. **cold start**: the worker waits ``--cold-start`` seconds (its start-delay file)
   before loading its model; the engine is ``starting`` all that time;
2. **idle**: ``--idle`` seconds with no request at all;
3. **load**: ``--load`` seconds of the demo's kind of traffic: ``--users`` clients,
   each sending one long prompt (1,200-2,000 characters, a few documents asked
   about again and again) after another, 8 tokens each, half of them streamed.

A watcher polls the agent's alerts once a second for the whole run (every alert seen
firing, by phase), and the agent's own ``kcops_engine_stalled_seconds`` (the longest
stall it measured). At the end the audit log is read: any ``action`` record, or any
``severity: page``, fails the check (exit 1).

    PYTHONPATH=. .venv/bin/python bench/nopage.py                  # 5 + 10 + 3 minutes
    PYTHONPATH=. .venv/bin/python bench/nopage.py --cold-start 20 --idle 30 --load 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.services import free_port, kcops_bin, running, wait_http  # noqa: E402

TOKEN = "bench-token"
DOCS = [
    " ".join(
        f"Section {d}.{i}: the fleet's queue depth, cache hit rate and decode rate."
        for i in range(n)
    )
    for d, n in ((1, 18), (2, 22), (3, 26), (4, 30))
]


@dataclass
class Watcher:
    """Polls the agent once a second: alerts firing (by phase) and the longest stall."""

    agent: str
    phase: str = "cold start"
    firing: dict[str, set[str]] = field(default_factory=dict)
    pages: dict[str, set[str]] = field(default_factory=dict)
    stalled_max: float = 0.0
    polls: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True, name="watch").start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                alerts = httpx.get(f"{self.agent}/api/v1/alerts", timeout=2).json()["alerts"]
                self.polls += 1
                for a in alerts:
                    if a.get("state") != "firing":
                        continue
                    self.firing.setdefault(self.phase, set()).add(a["alertname"])
                    if a["labels"].get("severity") == "page":
                        self.pages.setdefault(self.phase, set()).add(a["alertname"])
                text = httpx.get(f"{self.agent}/metrics", timeout=2).text
                for line in text.splitlines():
                    if line.startswith("kcops_engine_stalled_seconds"):
                        self.stalled_max = max(self.stalled_max, float(line.rsplit(" ", 1)[1]))


def load(worker: str, users: int, seconds: float) -> tuple[int, list[str]]:
    """``users`` clients sending long prompts for ``seconds``; (completions, errors)."""
    done, errors = [0], []
    ends = time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(k)
        with httpx.Client(timeout=120) as c:
            while time.monotonic() < ends:
                doc = rng.choice(DOCS)[: rng.randrange(1200, 2000)]
                body = {"model": "tiny", "prompt": f"{doc}\nQuestion {rng.randrange(9)}:",
                        "max_tokens": 8, "stream": rng.random() < 0.5}  # fmt: skip
                try:
                    r = c.post(f"{worker}/v1/completions", json=body)
                    r.raise_for_status()
                    done[0] += 1
                except httpx.HTTPError as exc:
                    errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 180)
    return done[0], errors


def actions(state: Path) -> list[dict[str, object]]:
    audit = state / "audit.jsonl"
    if not audit.exists():
        return []
    out = []
    for line in audit.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rec = json.loads(line)
            if rec.get("kind") == "action":
                out.append(rec)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold-start", type=float, default=300.0, help="seconds (default 300)")
    ap.add_argument("--idle", type=float, default=600.0, help="seconds (default 600)")
    ap.add_argument("--load", type=float, default=180.0, help="seconds (default 180)")
    ap.add_argument("--users", type=int, default=2, help="load clients (default 2)")
    args = ap.parse_args()
    for name in ("cold_start", "idle", "load"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be 0 or more seconds")
    tmp = Path(tempfile.mkdtemp(prefix="kcops-nopage-"))
    wport, aport = free_port(), free_port()
    worker, agent = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{aport}"
    state = tmp / "state"
    delay = tmp / "start-delay"
    delay.write_text(f"{args.cold_start:g}\n")
    env = {"KCOPS_TOKEN": TOKEN, "KCOPS_PROBE_SOCKET": str(tmp / "probe.sock")}
    cmd = [kcops_bin(), "agent", "run", "--mode", "enforce", "--listen", f"127.0.0.1:{aport}",
           "--state-dir", str(state), "--engine-url", worker, "--engine-adapter", "kcops", "--",
           kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--enable-faults",
           "--start-delay-file", str(delay)]  # fmt: skip
    watch = Watcher(agent)
    spans: dict[str, float] = {}
    with running(cmd, log_path=tmp / "agent.log", env=env) as proc:
        wait_http(f"{agent}/healthz", 60, proc)
        watch.start()
        t = time.monotonic()
        wait_http(f"{worker}/health", args.cold_start + 300, proc)
        spans["cold start"] = time.monotonic() - t
        print(f"cold start: the worker answered /health after {spans['cold start']:.0f} s")
        watch.phase, t = "idle", time.monotonic()
        time.sleep(args.idle)
        spans["idle"] = time.monotonic() - t
        print(f"idle: {spans['idle']:.0f} s")
        watch.phase, t = "load", time.monotonic()
        served, errors = load(worker, args.users, args.load)
        spans["load"] = time.monotonic() - t
        print(f"load: {served} completions, {len(errors)} errors in {spans['load']:.0f} s")
        time.sleep(3)  # the last tick's alerts
        watch.stop()
    acted = actions(state)
    print(f"\n{'phase':<12}{'seconds':>9}  alerts firing (pages in bold)")
    for phase, secs in spans.items():
        fired = sorted(watch.firing.get(phase, set()))
        pages = watch.pages.get(phase, set())
        shown = ", ".join(f"**{a}**" if a in pages else a for a in fired) or "none"
        print(f"{phase:<12}{secs:>9.0f}  {shown}")
    print(f"longest stall the agent measured: {watch.stalled_max:.1f} s; "
          f"{watch.polls} polls; actions audited: {len(acted)}")  # fmt: skip
    for rec in acted:
        print(f"  action {rec.get('action')}: {rec.get('outcome')} {rec.get('detail', '')}")
    if errors:
        print(f"load errors: {errors[:3]}")
    print(f"logs: {tmp}")
    paged = any(watch.pages.values())
    return 1 if paged or acted or errors or not watch.polls else 0


if __name__ == "__main__":
    sys.exit(main())
