"""What ``kcops demo`` runs on: Redis, the agent supervising the reference worker, load.

:class:`DemoEnv` starts the processes (each in its own session, logging to the
work folder) and stops them all, even on failure; the helpers ask the agent and
the worker what they see, over their HTTP APIs, with a deadline on every wait.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import click
import httpx
import psutil
import yaml

from kcops.cli.common import agent_request
from kcops.demo import cgroup as demo_cgroup
from kcops.demo.load.run import LocustRun
from kcops.demo.proxy import DelayProxy
from kcops.errors import Unreachable

# The demo's worker keeps a 128 MiB in-memory KV cache (about 2,800 tokens of
# SmolLM2): the steady traffic's documents fit, so their prefixes hit in memory
# and the worker's memory stays steady (the memory drills need a known baseline);
# the segment-transfer drill shrinks it below one long document's KV, so that
# document's blocks spill to the Redis tier and come back from it.
T = TypeVar("T")
CACHE_BUDGET_BYTES = 128 * 1024**2
REDIS_MAXMEMORY = "512mb"  # a cache tier with a bound, as deployed: LRU past it
# The device the memory drills fill: the worker's cgroup limit, set once the model
# is loaded to its resident memory plus this much room.
DEVICE_HEADROOM_BYTES = 1024**3
# A start that takes longer than this fires KcopsEngineStartSlow (production default
# 600 s); the start-slow drill delays a start past it.
DEMO_STARTUP_TIMEOUT_S = 120.0
# The demo's steady traffic: one user asking about a few documents (high prefix
# reuse), long prompts just past the worker's long threshold. A shared 2-core CPU
# serves it without queueing, so the baseline is healthy and each drill's cause is
# what moves its alert; more users queue behind each prefill (the TTFT drill).
LOAD_USERS = 1
LOAD_ENV = {"KCOPS_LOAD_POOL": "4", "KCOPS_LOAD_LONG_CHARS": "1200-2000"}
DEMO_COOLDOWN_S = 30.0
DEMO_TOP_N = 64  # the worker's attention budget N (kcops serve's default)
DEMO_TOPN_MAX = 8192  # N's ceiling (shipped 1024): over 4x a recommendation of a few hundred
# Every long request is shadow-checked: at the demo's rate a smaller share would
# leave the accuracy drill minutes between checks.
SHADOW_FRACTION = 1.0
# The worker's probe samples 10% of attention calls, 33x the shipped default. At 0.3%
# the demo's few requests a second gave six K(C) values a minute, too few for a 1m
# mean (the K(C) surge rule's) to tell a shift of the traffic from noise; 3% gave that
# rule enough but a layer only 12-17 values a minute, 12 minutes to the live
# recommendation's 200 a layer. At 10% a layer got 25-31 a minute (measured); a sampled
# call costs about 3.5% of a CPU decode step (docs/benchmarks.md), so 3 a step is
# about +7% on 3%'s.
PROBE_SAMPLE_RATE = 0.1
# The live K(C) recommendation (docs/kc.md) on the demo's scale: the shipped hour-long
# window, 10-minute schedule and 200 samples a layer would give the budget-mismatch
# drill nothing to compare with for the first half hour. A 10m window recomputed every
# 30 s, and 100 samples a layer: 3.5 minutes of the usual load at 10% (measured).
RECOMMENDATION: dict[str, object] = {"interval_s": 30, "window_s": 600, "min_samples": 100}
# Calibrated as `kc sweep` calibrated SmolLM2 (pydoc corpus, context 1024, layers 0
# and 1 dense as the worker keeps them): its recommended N=256 is the K_0.9 of the
# 6.25% quantile of calls. Uncalibrated (0.95 of calls) the live figure on the demo's
# traffic is 180-320 keys, over 2.5x the demo's N of 64, whose shadow agreement holds
# (the accuracy drill needs N=2 to move it): the budget rule would fire from the
# start, on a mass figure that is not an accuracy one.
CALIBRATION = {"smollm2": {"p": 0.9, "quantile": 0.0625}}


class DemoFailed(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kcops_exe() -> str:
    here = Path(sys.executable).parent / "kcops"
    return str(here) if here.exists() else (shutil.which("kcops") or "kcops")


def wait(what: str, timeout_s: float, probe: Callable[[], T | None], every_s: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy, showing the wait.

    On a terminal one line counts up; in a log (``make demo`` piped) a line
    every 10 s, so the output stays readable.
    """
    tty = sys.stdout.isatty()
    t0 = time.monotonic()
    shown = 0.0
    while True:
        try:
            got = probe()
        except (httpx.HTTPError, Unreachable):
            got = None
        elapsed = time.monotonic() - t0
        if got:
            prefix = "\r" if tty else ""
            click.echo(f"{prefix}  {what}: done in {elapsed:.1f}s" + " " * 10)
            return got
        if elapsed > timeout_s:
            if tty:
                click.echo("")
            raise DemoFailed(f"{what}: not within {timeout_s:.0f}s")
        if tty and elapsed - shown >= 1.0:
            click.echo(f"\r  {what}: waiting {elapsed:.0f}s", nl=False)
            shown = elapsed
        elif not tty and elapsed - shown >= 10.0:
            click.echo(f"  {what}: still waiting ({elapsed:.0f}s)")
            shown = elapsed
        time.sleep(every_s)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Stopped(SystemExit):
    """The demo was told to stop by a signal: exits 128 + its number, as a shell reports."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


def _stop_on_signal(signum: int, _frame: object) -> None:
    click.echo(f"\n- {signal.Signals(signum).name}: stopping the demo's processes", err=True)
    raise Stopped(signum)


class DemoEnv:
    """The demo's processes and addresses. Use as a context manager: exit stops them all."""

    def __init__(
        self,
        work: Path,
        model: str,
        rule_params: dict[str, object] | None = None,
        max_for: str | None = None,
        max_keep_firing_for: str | None = None,
    ) -> None:
        self.work = work
        self.model = model
        self.rule_params = rule_params or {}
        self.max_for, self.max_keep_firing_for = max_for, max_keep_firing_for
        self.redis_url: str | None = None  # the agent's own, direct connection to Redis
        self.state_dir = work / "state"
        self.token = secrets.token_hex(16)
        self.agent = f"http://127.0.0.1:{free_port()}"
        self.worker = f"http://127.0.0.1:{free_port()}"
        self.load_mode_file = work / "load-mode"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.first_pid: int | None = None
        self.notices: list[dict[str, Any]] = []
        self._webhook: ThreadingHTTPServer | None = None
        self.start_delay_file = work / "start-delay"
        self.redis_proxy: DelayProxy | None = None
        self.cgroup: demo_cgroup.MemoryCgroup | None = None
        self.no_cgroup_reason = "not created"
        self.overload: LocustRun | None = None  # the TTFT drill's extra users
        self.load_since: float | None = None  # when the usual load (mixed) began
        self._old_handlers: dict[int, Any] = {}

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def __enter__(self) -> DemoEnv:
        # SIGTERM or SIGHUP (a `timeout`, a closed SSH session, CI giving up) stops the
        # demo like Ctrl-C: the `finally`s and __exit__ run and every child goes too
        # (each runs in its own session, so no signal reaches them by itself).
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._old_handlers[sig] = signal.signal(sig, _stop_on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig in self._old_handlers:  # stopping now: a second signal must not cut it short
            signal.signal(sig, signal.SIG_IGN)
        try:
            self._stop_all()
        finally:
            for sig, old in self._old_handlers.items():
                signal.signal(sig, old)
            self._old_handlers.clear()

    def _stop_all(self) -> None:
        if self._webhook is not None:
            self._webhook.shutdown()
            self._webhook.server_close()
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        if self.redis_proxy is not None:
            self.redis_proxy.close()
        if self.cgroup is not None:
            self.cgroup.remove()

    def _spawn(self, cmd: list[str], log: str, env: dict[str, str] | None = None) -> None:
        with open(self.work / log, "wb") as fh:
            self.procs.append(
                subprocess.Popen(
                    cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            )

    def start_webhook(self) -> str:
        """A local receiver for the agent's notify/page messages (kept in ``notices``)."""
        notices = self.notices

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(min(int(self.headers.get("Content-Length", 0)), 1 << 20))
                try:
                    notices.append(json.loads(body))
                except ValueError:
                    notices.append({"raw": body[:200].decode(errors="replace")})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self._webhook = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        threading.Thread(target=self._webhook.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._webhook.server_address[1]}/notify"

    def start_redis(self) -> str | None:
        exe = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if exe is None:
            click.echo("- redis-server not installed: the KV cache runs without its Redis tier")
            return None
        port = free_port()
        self._spawn(
            [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--maxmemory", REDIS_MAXMEMORY, "--maxmemory-policy", "allkeys-lru"],
            "redis.log",
        )  # fmt: skip
        # The worker reaches Redis through a proxy the segment-transfer drill can slow.
        self.redis_url = f"redis://127.0.0.1:{port}/0"
        self.redis_proxy = DelayProxy("127.0.0.1", port).start()
        url = f"redis://127.0.0.1:{self.redis_proxy.port}/0"
        click.echo(f"- redis-server on port {port}, reached by the worker through {url}")
        return url

    def make_cgroup(self) -> None:
        try:
            self.cgroup = demo_cgroup.create(f"kcops-demo-{os.getpid()}")
            click.echo(f"- the worker runs in memory cgroup {self.cgroup.path}")
        except (demo_cgroup.NoCgroup, OSError) as exc:
            self.no_cgroup_reason = str(exc)
            click.echo(f"- no memory cgroup for the worker ({exc}): memory drills not run")

    def limit_device(self) -> None:
        """Size the worker's "device": its cgroup limit, from its memory once warm.

        Called after some load: the model's pages are touched by the first requests."""
        if self.cgroup is None or self.first_pid is None:
            return
        rss = psutil.Process(int(self.first_pid)).memory_info().rss
        limit = rss + DEVICE_HEADROOM_BYTES
        self.cgroup.set_limit(limit)
        click.echo(
            f"- worker memory {rss / 2**20:.0f} MiB; its cgroup limit (the device) "
            f"{limit / 2**20:.0f} MiB"
        )

    def agent_config(self) -> dict[str, object]:
        """The demo agent's config: shipped defaults but for what the drills need."""
        actions: dict[str, object] = {
            "notify": {"url": self.start_webhook()},
            "guards": {
                # Fourteen drills in an hour are fourteen incidents, several
                # of them paging at once: more than the shipped hourly budgets (20
                # runs, 6 of one action) and 5-minute cooldowns allow by design.
                "budget_per_hour": 120,
                "action_budget_per_hour": 40,
                "cooldown_s": DEMO_COOLDOWN_S,
            },
        }
        if self.redis_url is not None:
            # evict_cache cleans the Redis tier too; scale_out raises the fleet's
            # replica floor under a lease in Redis (there is no cluster to grow here).
            actions["evict"] = {"redis_url": self.redis_url}
            actions["scale"] = {"lease": {"backend": "redis"}}
        rules: dict[str, object] = {"params": self.rule_params}
        if self.max_for or self.max_keep_firing_for:
            rules["file"] = str(self.write_rules())
        return {
            "rules": rules,
            "actions": actions,
            "engine": {"startup_timeout_s": DEMO_STARTUP_TIMEOUT_S},
            "recommendation": {
                **RECOMMENDATION,
                "model": self.model,  # the name the calibration is kept under
                "calibration": CALIBRATION,
            },
        }

    def write_rules(self) -> Path:
        """The shipped rule file with ``for``/``keep_firing_for`` capped (``work/rules.yaml``)."""
        from kcops.agent.duration import parse_duration
        from kcops.agent.rules.loader import default_rules_path
        from kcops.agent.yamlload import load_yaml_file

        data = load_yaml_file(default_rules_path())
        caps = (("for", self.max_for), ("keep_firing_for", self.max_keep_firing_for))
        for group in data["groups"]:
            for rule in group["rules"]:
                for key, cap in caps:
                    if cap and key in rule and parse_duration(rule[key]) > parse_duration(cap):
                        rule[key] = cap
        path = self.work / "rules.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def start_agent(self, redis_url: str | None) -> None:
        worker_cmd = [
            kcops_exe(), "serve", "--model", self.model, "--port", self.worker.rsplit(":", 1)[1],
            "--enable-faults", "--long-threshold", "256", "--shadow-fraction", str(SHADOW_FRACTION),
            # The accuracy drill lowers N to 2, below the shipped floor of 16; the
            # budget-mismatch drill raises it past 4x the live recommendation.
            "--top-n", str(DEMO_TOP_N), "--topn-min", "2", "--topn-max", str(DEMO_TOPN_MAX),
            "--cache-budget-bytes", str(CACHE_BUDGET_BYTES),
            "--start-delay-file", str(self.start_delay_file),
        ]  # fmt: skip
        if redis_url:
            worker_cmd += ["--redis", redis_url]
        config = self.work / "agent.yaml"
        config.write_text(yaml.safe_dump(self.agent_config()))
        agent_cmd = [
            kcops_exe(), "agent", "run", "--config", str(config),
            "--listen", self.agent.split("://", 1)[1],
            "--state-dir", str(self.state_dir), "--mode", "enforce",
            "--engine-url", self.worker, "--engine-adapter", "kcops", "--",
            *(self.cgroup.wrap(worker_cmd) if self.cgroup is not None else worker_cmd),
        ]  # fmt: skip
        click.echo("- agent (enforce mode) supervising: " + " ".join(worker_cmd[1:]))
        env = {
            **os.environ,
            "KCOPS_TOKEN": self.token,
            "KCOPS_PROBE_SOCKET": str(self.work / "probe.sock"),
            "KCOPS_PROBE_SAMPLE_RATE": str(PROBE_SAMPLE_RATE),
            "PYTHONUNBUFFERED": "1",
        }
        self._spawn(agent_cmd, "agent.log", env)
        wait(
            "agent answering", 60, lambda: httpx.get(self.agent + "/healthz", timeout=1).is_success
        )
        wait(
            f"worker loaded {self.model} (first run converts the model once)",
            600,
            lambda: httpx.get(self.worker + "/health", timeout=1).is_success,
        )
        self.first_pid = self.worker_state()["pid"]
        click.echo(
            f"- agent {self.agent}, worker {self.worker}; "
            f"watch with `kcops top --agent {self.agent}`"
        )

    # -- what the parts see ----------------------------------------------------

    def worker_state(self) -> dict[str, Any]:
        return dict(httpx.get(self.worker + "/admin/state", timeout=2).json())

    def route_mode(self) -> str:
        """The worker's route mode, or ``?`` while it does not answer (being restarted)."""
        try:
            return str(self.worker_state()["route_mode"])
        except (httpx.HTTPError, ValueError, KeyError):
            return "?"

    def reset_route(self) -> None:
        """Route mode back to normal, waiting for a worker that is being restarted."""

        def probe() -> bool:
            if self.route_mode() == "normal":
                return True
            self.admin("/admin/route", {"mode": "normal"})
            return self.route_mode() == "normal"

        wait("route mode back to normal for the next drill", 300, probe, every_s=1)

    def fault(self, body: dict[str, object]) -> None:
        self.admin("/admin/faults", body)

    def admin(self, path: str, body: dict[str, object]) -> None:
        self._post(self.worker + path, body, 10, f"POST {path} {body}")

    def _post(
        self, url: str, body: dict[str, object], timeout_s: float, what: str
    ) -> httpx.Response:
        r = httpx.post(url, json=body, headers=self.headers, timeout=timeout_s)
        if r.status_code != 200:
            raise DemoFailed(f"{what}: HTTP {r.status_code}: {r.text[:200]}")
        return r

    def query(self, expr: str) -> float | None:
        """One value of an instant query to the agent (its rule evaluator), or None."""
        return instant_value(self.agent, expr)

    def run_action(self, name: str, params: dict[str, object] | None = None) -> dict[str, Any]:
        """Run an agent action as on-call would (``kcops actions run``), through its guards."""
        body = {"params": params or {}, "force": True, "reason": "kcops demo drill"}
        return dict(
            self._post(f"{self.agent}/api/v1/actions/{name}", body, 300, f"action {name}").json()
        )

    def cooldowns_left(self) -> dict[str, float]:
        """The agent's guard cooldowns still running: target -> seconds left."""
        r = httpx.get(f"{self.agent}/api/v1/actions", headers=self.headers, timeout=5)
        r.raise_for_status()
        return {k: float(v) for k, v in r.json()["guards"]["cooldowns"].items() if float(v) > 0}

    def alert_state(self, alertname: str) -> str:
        """``firing``, ``pending`` or ``inactive`` (the worst of the alert's instances)."""
        alerts = httpx.get(self.agent + "/api/v1/alerts", timeout=5).json()["alerts"]
        states = {a["state"] for a in alerts if a.get("alertname") == alertname}
        return "firing" if "firing" in states else "pending" if "pending" in states else "inactive"

    def alerts_since(self, t0: float) -> list[str]:
        """The alerts pending or firing at any of the agent's ticks since ``t0``."""
        window = max(1, math.ceil(time.time() - t0))
        q = f'max_over_time(kcops_alert_state{{state=~"pending|firing"}}[{window}s]) > 0'
        r = httpx.get(self.agent + "/api/v1/query", params={"query": q}, timeout=10)
        r.raise_for_status()
        return sorted({x["metric"]["alertname"] for x in r.json()["data"]["result"]})

    def audit_runs(self, since: float) -> list[dict[str, Any]]:
        """Actions the agent ran (outcome ok) since ``since``, from its audit log."""
        path = self.state_dir / "audit.jsonl"
        out = []
        for raw in path.read_text().splitlines() if path.exists() else []:
            with contextlib.suppress(ValueError):
                rec = json.loads(raw)
                ok = rec.get("kind") == "action" and rec.get("outcome") == "ok"
                if ok and float(rec.get("ts", 0)) >= since:
                    out.append(rec)
        return out

    def start_locust(self, name: str, users: int) -> LocustRun:
        """Locust users against the worker (stats ``<work>/<name>_stats.csv``), stopped on exit."""
        run = LocustRun(
            self.worker, self.work / name, users=users, spawn_rate=max(1, users),
            run_time_s=4 * 3600, max_tokens=8, log_path=self.work / f"{name}.log",
            mode_file=self.load_mode_file, env=LOAD_ENV,
        )  # fmt: skip
        run.start()
        assert run.proc is not None
        self.procs.append(run.proc)
        return run

    def set_load_mode(self, mode: str) -> None:
        """The Locust users read this file: mixed, unique (no reuse), long, short or hot."""
        self.load_mode_file.write_text(mode)


# What the agent knows, asked through its own query API (the rule engine's evaluator).
SUMMARY = (  # label, format, expression
    ("completions seen", "{:.0f}", "sum(kcops_request_latency_seconds_count)"),
    ("p99 latency (1m), s", "{:.3f}",
     "histogram_quantile(0.99, sum by (le) (rate(kcops_request_latency_seconds_bucket[1m])))"),
    ("prefix-cache hit rate", "{:.1%}",
     "sum(kcops_prefix_cache_hits_total) / sum(kcops_prefix_cache_queries_total)"),
    ("KV cache usage", "{:.1%}", "max(kcops_kv_cache_usage_ratio)"),
    ("device memory used", "{:.1%}",
     "max(kcops_device_memory_used_bytes / kcops_device_memory_total_bytes)"),
    ("attention calls", "{:.0f}", "sum(kcops_attention_calls_total)"),
    ("K(C) median, tokens (p=0.9)", "{:.0f}",
     "histogram_quantile(0.5, sum by (le) (kcops_kc_tokens_bucket))"),
    ("kappa median", "{:.1%}", "histogram_quantile(0.5, sum by (le) (kcops_kc_ratio_bucket))"),
    ("top-32 keys' mass, median", "{:.1%}",
     'histogram_quantile(0.5, sum by (le) (kcops_topn_mass_ratio_bucket{n="32"}))'),
)  # fmt: skip


def instant_value(agent: str, expr: str) -> float | None:
    """The first sample of an instant query to the agent (NaN kept), or None when it
    answers none (an error answer included)."""
    body = agent_request("GET", agent, "/api/v1/query?" + urlencode({"query": expr})).json()
    result = body.get("data", {}).get("result") if body.get("status") == "success" else None
    return float(result[0]["value"][1]) if isinstance(result, list) and result else None


def summary(agent: str) -> list[str]:
    rows = []
    for label, fmt, expr in SUMMARY:
        value = instant_value(agent, expr)
        text = "absent" if value is None else "n/a" if value != value else fmt.format(value)
        rows.append(f"{label:<30} {text}")
    return rows
