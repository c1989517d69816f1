"""``kcops demo``: the whole loop on this machine, with real parts.

It starts a real Redis (when installed), the agent in enforce mode supervising
the reference worker with a real small model and the probe, sends real load,
then runs two fault drills and shows the agent detect and repair each:

1. NaN injected into attention -> ``KcopsAttentionErrors`` fires ->
   ``fallback_to_base`` routes everything to the base model;
2. the worker's loop hangs -> ``KcopsEngineDown`` fires after its ``for`` ->
   ``restart_worker`` replaces the process and a new pid answers.

Every step has a deadline; a step that does not happen says so and the demo
exits 1. Logs and the audit log stay in the printed work folder.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import httpx

from kcops.agent.cli.common import EXIT_FAILURE, handle_errors

CONTEXT_HINT = "see the logs in {work}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kcops() -> str:
    here = Path(sys.executable).parent / "kcops"
    return str(here) if here.exists() else (shutil.which("kcops") or "kcops")


class DemoFailed(Exception):
    pass


def _wait(what: str, timeout_s: float, probe: Callable[[], Any], every_s: float = 0.5) -> Any:
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
        except httpx.HTTPError:
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


def _prompts() -> list[str]:
    """Real English text from CPython's own documentation, varied lengths."""
    import pydoc_data.topics as topics

    texts = [t for t in topics.topics.values() if len(t) > 2000]
    texts.sort(key=len)
    out = []
    for i, t in enumerate(texts[:40]):
        n = 400 + (i % 8) * 450  # 400 .. 3550 characters: short and long requests
        out.append(t[:n])
    return out


class Load:
    """A background client sending completions until stopped; counts outcomes."""

    def __init__(self, url: str, prompts: list[str]) -> None:
        self.url = url
        self.prompts = prompts
        self.ok = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        i = 0
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                # Repeat prompts so the prefix cache sees hits, as real traffic does.
                prompt = self.prompts[i % len(self.prompts)] if i % 3 else self.prompts[0]
                i += 1
                try:
                    r = client.post(
                        self.url + "/v1/completions",
                        json={"prompt": prompt, "max_tokens": 8, "temperature": 0},
                    )
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failed += 1
                except httpx.HTTPError:
                    self.failed += 1
                    self._stop.wait(0.5)


# What the agent knows, asked through its own query API (the rule engine's evaluator).
SUMMARY = (
    ("completions seen", "sum(kcops_request_latency_seconds_count)", "{:.0f}"),
    (
        "p99 latency (1m), s",
        "histogram_quantile(0.99, sum by (le) (rate(kcops_request_latency_seconds_bucket[1m])))",
        "{:.3f}",
    ),
    (
        "prefix-cache hit rate",
        "sum(kcops_prefix_cache_hits_total) / sum(kcops_prefix_cache_queries_total)",
        "{:.1%}",
    ),
    ("KV cache usage", "max(kcops_kv_cache_usage_ratio)", "{:.1%}"),
    (
        "device memory used",
        "max(kcops_device_memory_used_bytes / kcops_device_memory_total_bytes)",
        "{:.1%}",
    ),
    ("attention calls", "sum(kcops_attention_calls_total)", "{:.0f}"),
    (
        "K(C) median, tokens (p=0.9)",
        "histogram_quantile(0.5, sum by (le) (kcops_kc_tokens_bucket))",
        "{:.0f}",
    ),
    ("kappa median", "histogram_quantile(0.5, sum by (le) (kcops_kc_ratio_bucket))", "{:.1%}"),
    (
        "top-32 keys' mass, median",
        'histogram_quantile(0.5, sum by (le) (kcops_topn_mass_ratio_bucket{n="32"}))',
        "{:.1%}",
    ),
)


def _summary(agent: str) -> list[str]:
    rows = []
    for label, expr, fmt in SUMMARY:
        body = httpx.get(agent + "/api/v1/query", params={"query": expr}, timeout=5).json()
        result = body.get("data", {}).get("result") if body.get("status") == "success" else None
        if isinstance(result, list) and result:
            value = float(result[0]["value"][1])
            text = "n/a" if value != value else fmt.format(value)
        else:
            text = "absent"
        rows.append(f"{label:<30} {text}")
    return rows


def _firing(agent: str, alertname: str) -> bool:
    data = httpx.get(agent + "/api/v1/alerts", timeout=5).json()
    alerts = data.get("alerts", data) if isinstance(data, dict) else data
    return any(a.get("alertname") == alertname and a.get("state") == "firing" for a in alerts)


def _audit_run(state_dir: Path, action: str, since: float) -> dict[str, Any] | None:
    path = state_dir / "audit.jsonl"
    if not path.exists():
        return None
    for raw in path.read_text().splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if (
            rec.get("action") == action
            and rec.get("kind") == "action"
            and rec.get("outcome") == "ok"
            and float(rec.get("ts", 0)) >= since
        ):
            return dict(rec)
    return None


def _state(worker: str) -> dict[str, Any]:
    return dict(httpx.get(worker + "/admin/state", timeout=2).json())


@click.command(
    "demo",
    help=(
        "Run the whole loop here: Redis, the agent supervising the reference worker "
        "(real model, probe), real load, then a NaN drill and a hang drill that the "
        "agent detects and repairs by itself."
    ),
)
@click.option(
    "--model", default="smollm2", show_default=True, help="Worker model: smollm2, tiny or PATH."
)
@click.option("--load-seconds", default=20.0, show_default=True, help="Healthy load phase length.")
@click.option("--drills/--no-drills", default=True, show_default=True, help="Run the fault drills.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Keep logs here (default: tmp).")
@handle_errors
def demo_cmd(model: str, load_seconds: float, drills: bool, workdir: str | None) -> None:
    work = Path(workdir or tempfile.mkdtemp(prefix="kcops-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    state_dir = work / "state"
    token = secrets.token_hex(16)
    env = {
        **os.environ,
        "KCOPS_TOKEN": token,
        "KCOPS_PROBE_SOCKET": str(work / "probe.sock"),
        "PYTHONUNBUFFERED": "1",
    }
    agent_port, worker_port = _free_port(), _free_port()
    agent = f"http://127.0.0.1:{agent_port}"
    worker = f"http://127.0.0.1:{worker_port}"
    procs: list[subprocess.Popen[bytes]] = []
    click.echo(f"kcops demo — work folder {work}")
    try:
        redis_url = None
        redis_exe = shutil.which("redis-server") or (
            "/usr/bin/redis-server" if Path("/usr/bin/redis-server").exists() else None
        )
        if redis_exe:
            rport = _free_port()
            procs.append(
                subprocess.Popen(
                    [redis_exe, "--port", str(rport), "--bind", "127.0.0.1", "--save", ""],
                    stdout=open(work / "redis.log", "wb"),  # noqa: SIM115
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            redis_url = f"redis://127.0.0.1:{rport}/0"
            click.echo(f"- redis-server on {redis_url}")
        else:
            click.echo("- redis-server not installed: the KV cache runs without its Redis tier")
        worker_cmd = [
            _kcops(), "serve", "--model", model, "--port", str(worker_port),
            "--enable-faults", "--long-threshold", "256", "--shadow-fraction", "0.25",
        ]  # fmt: skip
        if redis_url:
            worker_cmd += ["--redis", redis_url]
        agent_cmd = [
            _kcops(), "agent", "run", "--listen", f"127.0.0.1:{agent_port}",
            "--state-dir", str(state_dir), "--mode", "enforce",
            "--engine-url", worker, "--engine-adapter", "kcops", "--", *worker_cmd,
        ]  # fmt: skip
        click.echo("- agent (enforce mode) supervising: " + " ".join(worker_cmd[1:]))
        procs.append(
            subprocess.Popen(
                agent_cmd,
                stdout=open(work / "agent.log", "wb"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        )
        _wait("agent answering", 60, lambda: httpx.get(agent + "/healthz", timeout=1).is_success)
        _wait(
            f"worker loaded {model} (first run converts the model once)",
            600,
            lambda: httpx.get(worker + "/health", timeout=1).is_success,
        )
        first_pid = _state(worker)["pid"]

        click.echo(f"- real load for {load_seconds:.0f}s (CPython docs as prompts)")
        load = Load(worker, _prompts())
        load.start()
        time.sleep(load_seconds)
        click.echo(f"  completions: {load.ok} ok, {load.failed} failed")
        click.echo("- what the agent sees (asked through its query API):")
        for line in _summary(agent):
            click.echo("    " + line)

        if drills:
            headers = {"Authorization": f"Bearer {token}"}
            click.echo("- drill 1: NaN injected into attention")
            t0 = time.time()
            httpx.post(worker + "/admin/faults", json={"nan": True}, headers=headers, timeout=5)
            _wait("KcopsAttentionErrors firing", 60, lambda: _firing(agent, "KcopsAttentionErrors"))
            rec = _wait(
                "fallback_to_base run by the agent",
                60,
                lambda: _audit_run(state_dir, "fallback_to_base", t0),
            )
            click.echo(f"  route mode now: {_state(worker)['route_mode']} (audit: {rec['action']})")
            httpx.post(worker + "/admin/faults", json={"clear": True}, headers=headers, timeout=5)

            click.echo("- drill 2: the worker's loop hangs")
            t1 = time.time()
            httpx.post(worker + "/admin/faults", json={"hang": True}, headers=headers, timeout=5)
            _wait(
                "KcopsEngineDown firing (for: 30s)", 120, lambda: _firing(agent, "KcopsEngineDown")
            )
            _wait(
                "restart_worker run by the agent",
                120,
                lambda: _audit_run(state_dir, "restart_worker", t1),
            )
            new_pid = _wait(
                "a new worker process answering",
                600,
                lambda: (p := _state(worker)["pid"]) != first_pid and p,
            )
            click.echo(f"  worker pid {first_pid} -> {new_pid}")
        load.stop()
        click.echo("- audit log (kcops actions history):")
        hist = subprocess.run(
            [_kcops(), "actions", "history", "--state-dir", str(state_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        for line in hist.stdout.splitlines()[-12:] or ["(no actions)"]:
            click.echo("    " + line)
        click.echo(f"demo ok — logs and audit log in {work}")
    except DemoFailed as exc:
        click.echo(f"demo failed: {exc}; " + CONTEXT_HINT.format(work=work), err=True)
        sys.exit(EXIT_FAILURE)
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
