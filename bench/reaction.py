"""Reaction time: the kcops agent vs Prometheus + Alertmanager on the same fault.

Starts a reference worker (`kcops serve --model tiny --enable-faults`), the
kcops agent watching it, and a Prometheus (1 s scrape of the agent's
/metrics, 1 s evaluation, the same rules exported by `kcops alerts export`)
with an Alertmanager (default group_wait) whose webhook goes to a receiver
in this script. It injects NaN into attention and measures, per rule:

- kcops: action start (audit log) - (active_since + for), from the agent;
- pair:  webhook arrival           - (activeAt + for), from Prometheus.

Several rules with different `for` values watch the same fault, so one run
gives several samples. Usage:

    .venv/bin/python bench/reaction.py [--fors 3,4,5,6,7] [--timeout 150]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.services import (  # noqa: E402
    free_port,
    kcops_bin,
    need_binary,
    running,
    wait_http,
)

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
EXPR = "sum(increase(kcops_attention_errors_total[30s])) > 0"


def rfc3339(value: str) -> float:
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = "".join(c for c in rest if c.isdigit())
        text = f"{head}.{digits[:6]}{rest[len(digits) :]}"
    return datetime.fromisoformat(text).timestamp()


class Hooks:
    """Alertmanager webhook receiver: first arrival time per alertname."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                t = time.time()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                for a in body.get("alerts", []):
                    if a.get("status") == "firing":
                        hooks.arrived.setdefault(a["labels"]["alertname"], t)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def traffic(url: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as c:
        i = 0
        while not stop.is_set():
            i += 1
            with contextlib.suppress(httpx.HTTPError):
                c.post(
                    f"{url}/v1/completions",
                    json={"model": "tiny", "prompt": f"bench {i} " * 10, "max_tokens": 2},
                )
            stop.wait(0.25)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fors", default="3,4,5,6,7", help="`for` of each rule, seconds")
    ap.add_argument("--timeout", type=float, default=150.0)
    args = ap.parse_args()
    fors = [int(x) for x in args.fors.split(",")]
    names = [f"BenchNaN{f}s" for f in fors]
    tmp = Path(tempfile.mkdtemp(prefix="kcops-reaction-"))
    prom_bin, am_bin = need_binary("prometheus"), need_binary("prometheus-alertmanager")
    wport, aport, pport, mport = free_port(), free_port(), free_port(), free_port()
    worker, agent = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{aport}"
    prom, am = f"http://127.0.0.1:{pport}", f"http://127.0.0.1:{mport}"
    hooks = Hooks()

    rules = {
        "groups": [
            {
                "name": "bench",
                "rules": [
                    {
                        "alert": n,
                        "expr": EXPR,
                        "for": f"{f}s",
                        "remediation": [{"action": "scale_out", "verify": "10m"}],
                    }
                    for n, f in zip(names, fors, strict=True)
                ],
            }
        ]
    }
    (tmp / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    exported = subprocess.run(
        [kcops_bin(), "alerts", "export", "--rules", str(tmp / "rules.yaml")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (tmp / "prom-rules.yaml").write_text(exported)
    (tmp / "agent.yaml").write_text(
        yaml.safe_dump(
            {
                "engine": {"url": worker, "adapter": "kcops"},
                "actions": {
                    "mode": "enforce",
                    "guards": {"cooldown_s": 0, "budget_per_hour": 100,
                               "action_budget_per_hour": 100},
                    "scale": {"max_replicas": 100},
                },
            }
        )
    )  # fmt: skip
    (tmp / "prometheus.yml").write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(tmp / "prom-rules.yaml")],
                "alerting": {
                    "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{mport}"]}]}]
                },
                "scrape_configs": [
                    {"job_name": "kcops", "static_configs": [{"targets": [f"127.0.0.1:{aport}"]}]}
                ],
            }
        )
    )
    # Alertmanager defaults: group_wait 30s, group_interval 5m.
    (tmp / "am.yml").write_text(
        yaml.safe_dump(
            {
                "route": {"receiver": "bench", "group_by": ["alertname"]},
                "receivers": [
                    {
                        "name": "bench",
                        "webhook_configs": [{"url": f"http://127.0.0.1:{hooks.port}/"}],
                    }
                ],
            }
        )
    )
    env = {"KCOPS_TOKEN": TOKEN, "KCOPS_PROBE_SOCKET": str(tmp / "probe.sock")}
    worker_cmd = [kcops_bin(), "serve", "--model", "tiny", "--port", str(wport),
                  "--enable-faults", "--threads", "1"]  # fmt: skip
    agent_cmd = [kcops_bin(), "agent", "run", "--config", str(tmp / "agent.yaml"),
                 "--listen", f"127.0.0.1:{aport}", "--state-dir", str(tmp / "state"),
                 "--rules", str(tmp / "rules.yaml")]  # fmt: skip
    prom_cmd = [
        prom_bin,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'prom'}",
        f"--web.listen-address=127.0.0.1:{pport}",
    ]
    am_cmd = [am_bin, f"--config.file={tmp / 'am.yml'}", f"--storage.path={tmp / 'am'}",
              f"--web.listen-address=127.0.0.1:{mport}", "--cluster.listen-address="]  # fmt: skip

    kc_active: dict[str, float] = {}
    prom_active: dict[str, float] = {}
    with (
        running(worker_cmd, log_path=tmp / "worker.log", env=env) as wp,
        running(agent_cmd, log_path=tmp / "agent.log", env=env) as agp,
        running(prom_cmd, log_path=tmp / "prometheus.log") as pp,
        running(am_cmd, log_path=tmp / "am.log") as mp,
    ):
        wait_http(f"{worker}/health", 120, wp)
        wait_http(f"{agent}/readyz", 60, agp)
        wait_http(f"{prom}/-/ready", 60, pp)
        wait_http(f"{am}/-/ready", 60, mp)
        stop = threading.Event()
        threading.Thread(target=traffic, args=(worker, stop), daemon=True).start()
        time.sleep(5)  # both sides have seen the error counter at 0
        r = httpx.post(f"{worker}/admin/faults", json={"nan": True}, headers=AUTH, timeout=10)
        r.raise_for_status()
        t_fault = time.time()
        print(f"NaN injected at {t_fault:.3f}; waiting for both sides ...", file=sys.stderr)
        deadline = time.monotonic() + args.timeout
        actions: dict[str, float] = {}
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                for a in httpx.get(f"{agent}/api/v1/alerts", timeout=2).json()["alerts"]:
                    if a.get("active_since"):
                        kc_active.setdefault(a["alertname"], float(a["active_since"]))
            with contextlib.suppress(httpx.HTTPError, ValueError):
                for a in httpx.get(f"{prom}/api/v1/alerts", timeout=2).json()["data"]["alerts"]:
                    prom_active.setdefault(a["labels"]["alertname"], rfc3339(a["activeAt"]))
            audit = tmp / "state" / "audit.jsonl"
            if audit.exists():
                for line in audit.read_text().splitlines():
                    rec = json.loads(line)
                    if rec.get("kind") == "action" and rec.get("ladder"):
                        actions.setdefault(rec["ladder"]["alertname"], float(rec["ts"]))
            if all(n in actions for n in names) and all(n in hooks.arrived for n in names):
                break
            time.sleep(0.1)
        stop.set()

    print("\nagent: `kcops agent run`")
    print(f"fault: NaN in attention; rule: {EXPR}; kcops tick 1 s; Prometheus scrape and")
    print("evaluation 1 s; Alertmanager group_wait default (30 s)")
    print(f"{'alert':<14}{'for':>5}  {'kcops action (s)':>17}  {'Prometheus+AM webhook (s)':>26}")
    kc_lat: list[float] = []
    pair_lat: list[float] = []
    for n, f in zip(names, fors, strict=True):
        kc = actions[n] - (kc_active[n] + f) if n in actions and n in kc_active else None
        pr = (
            hooks.arrived[n] - (prom_active[n] + f)
            if n in hooks.arrived and n in prom_active
            else None
        )
        if kc is not None:
            kc_lat.append(kc)
        if pr is not None:
            pair_lat.append(pr)
        fmt = lambda v: "—" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{n:<14}{f:>4}s  {fmt(kc):>17}  {fmt(pr):>26}")
    if kc_lat and pair_lat:
        print(
            f"{'median':<14}{'':>5}  {statistics.median(kc_lat):>17.3f}  "
            f"{statistics.median(pair_lat):>26.3f}"
        )
        ratio = statistics.median(pair_lat) / max(statistics.median(kc_lat), 1e-3)
        print(f"ratio (pair / kcops, medians): {ratio:.0f}x")
    print(f"logs and configs: {tmp}")
    ok = bool(kc_lat) and statistics.median(kc_lat) <= 1.0
    print("goal kcops <= 1 s median:", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
