"""Recovery: seconds from a stopped engine to the page, to out-of-rotation and to serving
again, with kcops, beside a kubelet-style liveness probe on the engine's /health.

Two failures (issue 22):

- ``worker``: a supervised reference worker (`kcops serve --model tiny --enable-faults`)
  whose loop hangs (fault ``{"hang": true}``: generation and /health stop);
- ``vllm`` (with ``--vllm-venv`` and ``--vllm-model``): a supervised `vllm serve` whose
  EngineCore process is stopped (SIGSTOP) with a streaming request in flight; its API
  server keeps answering /health.

The agent runs its shipped rules and defaults (enforce mode). From the fault on, this
script polls every 0.25 s: the agent's alerts (the first firing ``severity: page``),
``/api/v1/engine/ready`` (the first 503), the audit (``restart_worker``) and a short
completion (the first one that succeeds). Beside it, in the same run, the baseline: a
kubelet-style liveness probe of the engine's ``/health`` (period 10 s, timeout 1 s,
3 consecutive failures => "would restart"). It keeps probing the engine the fault hit
so it runs where kcops does not act: each failure is run twice, once with the agent in
enforce mode (kcops's figures) and once in dry-run mode (it still pages and answers 503,
and takes no action), where the liveness probe watches the stopped engine for
``--hold`` seconds or until it would restart.

    .venv/bin/python bench/recovery.py [--timeout 300]
    .venv/bin/python bench/recovery.py --vllm-venv .venv-vllm --vllm-model DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.services import free_port, kcops_bin, running, wait_http  # noqa: E402

TOKEN = "bench-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
POLL_S = 0.25
PERIOD_S, FAILURES, PROBE_TIMEOUT_S = 10.0, 3, 1.0  # the kubelet's liveness defaults


class Liveness:
    """A kubelet-style liveness probe: GET /health every PERIOD_S; FAILURES failures in a
    row would restart the container. ``stop()`` ends it (the engine it probes is gone)."""

    def __init__(self, url: str, t0: float) -> None:
        self.url, self.t0 = url, t0
        self.checks = 0
        self.failures = 0
        self.would_restart: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="liveness")
        self._thread.start()

    def _run(self) -> None:
        row = 0
        while not self._stop.wait(PERIOD_S):
            try:
                ok = httpx.get(f"{self.url}/health", timeout=PROBE_TIMEOUT_S).status_code < 400
            except httpx.HTTPError:
                ok = False
            if self._stop.is_set():
                return
            self.checks += 1
            self.failures += not ok
            row = 0 if ok else row + 1
            if row >= FAILURES and self.would_restart is None:
                self.would_restart = time.monotonic() - self.t0

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Figures:
    engine: str
    fault: str
    mode: str
    page: float | None = None
    page_alert: str = ""
    out_of_rotation: float | None = None
    restart: float | None = None
    serving: float | None = None
    detail: str = ""
    baseline: Liveness | None = None
    notes: list[str] = field(default_factory=list)


def _first_page(agent: str) -> str | None:
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        for a in httpx.get(f"{agent}/api/v1/alerts", timeout=2).json()["alerts"]:
            if a.get("state") == "firing" and a["labels"].get("severity") == "page":
                return str(a["alertname"])
    return None


def _ready_503(agent: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{agent}/api/v1/engine/ready", timeout=2).status_code == 503
    return False


def _restart(state: Path) -> dict[str, object] | None:
    audit = state / "audit.jsonl"
    if not audit.exists():
        return None
    for line in audit.read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") == "action" and rec.get("action") == "restart_worker":
            return dict(rec)
    return None


def _serves(engine: str, model: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        r = httpx.post(
            f"{engine}/v1/completions",
            json={"model": model, "prompt": "Hello", "max_tokens": 2},
            timeout=2,
        )
        return r.status_code == 200
    return False


def watch(
    fig: Figures, agent: str, engine: str, model: str, state: Path, t0: float, timeout: float
) -> None:
    """Poll from the fault until the engine serves again after a restart (or timeout); with
    a baseline, until it would restart (or timeout)."""
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        if fig.baseline is not None:
            now = time.monotonic() - t0
            if fig.page is None and (name := _first_page(agent)):
                fig.page, fig.page_alert = now, name
            if fig.out_of_rotation is None and _ready_503(agent):
                fig.out_of_rotation = now
            if fig.baseline.would_restart is not None:
                return
            time.sleep(POLL_S)
            continue
        now = time.monotonic() - t0
        if fig.page is None and (name := _first_page(agent)):
            fig.page, fig.page_alert = now, name
        if fig.out_of_rotation is None and _ready_503(agent):
            fig.out_of_rotation = now
        if fig.restart is None and (rec := _restart(state)):
            fig.restart, fig.detail = now, str(rec.get("detail", ""))
        if fig.restart is not None and _serves(engine, model):
            fig.serving = time.monotonic() - t0
            return
        time.sleep(POLL_S)


def worker_run(tmp: Path, timeout: float, mode: str) -> Figures:
    wport, aport = free_port(), free_port()
    worker, agent = f"http://127.0.0.1:{wport}", f"http://127.0.0.1:{aport}"
    state = tmp / f"worker-{mode}-state"
    env = {"KCOPS_TOKEN": TOKEN, "KCOPS_PROBE_SOCKET": str(tmp / f"worker-{mode}-probe.sock")}
    cmd = [kcops_bin(), "agent", "run", "--mode", mode, "--listen", f"127.0.0.1:{aport}",
           "--state-dir", str(state), "--engine-url", worker, "--engine-adapter", "kcops", "--",
           kcops_bin(), "serve", "--model", "tiny", "--port", str(wport), "--enable-faults",
           "--threads", "1"]  # fmt: skip
    fig = Figures("reference worker (--model tiny)", 'fault {"hang": true}', mode)
    with running(cmd, log_path=tmp / f"worker-{mode}-agent.log", env=env) as proc:
        wait_http(f"{agent}/readyz", 120, proc)
        wait_http(f"{worker}/health", 120, proc)
        _until(lambda: not _ready_503(agent) and _serves(worker, "tiny"), 120, "worker ready")
        r = httpx.post(f"{worker}/admin/faults", json={"hang": True}, headers=AUTH, timeout=10)
        r.raise_for_status()
        t0 = time.monotonic()
        fig.baseline = Liveness(worker, t0) if mode == "dry-run" else None
        watch(fig, agent, worker, "tiny", state, t0, timeout)
        if fig.baseline is not None:
            fig.baseline.stop()
    return fig


def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(POLL_S)


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def vllm_run(tmp: Path, venv: str, model: str, timeout: float, mode: str) -> Figures:
    os.environ["KCOPS_VLLM_VENV"], os.environ["KCOPS_VLLM_MODEL"] = venv, model
    os.environ["KCOPS_VLLM_SUITE_MODE"] = mode  # the harness's agent mode
    tmp = tmp / f"vllm-{mode}"
    tmp.mkdir()
    from tests.engines.vllm.harness import MODEL_NAME, stream_completion, supervised_vllm
    from tests.engines.vllm.test_stall import PROMPT, engine_core_pid

    fig = Figures("vLLM (SmolLM2-135M, CPU)", "EngineCore SIGSTOP, a stream in flight", mode)
    with supervised_vllm(tmp) as (stack, _):
        fig.notes.append(
            f"cold start (agent start to /health): {stack.ready_at - stack.started_at:.0f} s"
        )
        _until(lambda: not _ready_503(stack.agent_url), 300, "vLLM ready")
        core = engine_core_pid(stack)
        req = stream_completion(stack.engine_url, PROMPT, 1800)
        if not req.first_chunk.wait(120) or req.error:
            raise RuntimeError(f"no stream: {req.error}")
        with _stopped(core):
            t0 = time.monotonic()
            fig.baseline = Liveness(stack.engine_url, t0) if mode == "dry-run" else None
            watch(fig, stack.agent_url, stack.engine_url, MODEL_NAME, stack.state_dir, t0, timeout)
            if fig.baseline is not None:
                fig.baseline.stop()
    return fig


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f}"


def report(figs: list[Figures]) -> None:
    print("\nseconds from the fault; kcops: shipped rules and defaults. liveness: the kubelet's")
    print(f"defaults on the engine's /health (period {PERIOD_S:.0f} s, timeout "
          f"{PROBE_TIMEOUT_S:.0f} s, {FAILURES} failures), the agent in dry-run")  # fmt: skip
    print(f"{'engine':<34}{'run':<10}{'page':>7}{'503':>7}{'restart':>9}{'serving':>9}"
          f"  liveness would restart")  # fmt: skip
    for f in figs:
        b = f.baseline
        base = ""
        if b is not None:
            base = (_s(b.would_restart) if b.would_restart is not None
                    else f"never ({b.checks} checks, {b.failures} failed)")  # fmt: skip
        print(f"{f.engine:<34}{f.mode:<10}{_s(f.page):>7}{_s(f.out_of_rotation):>7}"
              f"{_s(f.restart):>9}{_s(f.serving):>9}  {base}")  # fmt: skip
    for f in figs:
        print(f"\n{f.engine}, {f.mode}: {f.fault}; first page {f.page_alert or '—'}")
        if f.detail:
            print(f"  restart_worker: {f.detail}")
        for n in f.notes:
            print(f"  {n}")
    for kc in (f for f in figs if f.mode == "enforce" and f.serving is not None):
        for b in (f.baseline for f in figs if f.engine == kc.engine and f.baseline):
            if b.would_restart is not None:
                print(f"{kc.engine}: liveness decides to restart at {b.would_restart:.1f} s, "
                      f"kcops serves again at {kc.serving:.1f} s "
                      f"({b.would_restart / kc.serving:.1f}x sooner)")  # fmt: skip
            else:
                print(f"{kc.engine}: liveness never decides; kcops serves again at "
                      f"{kc.serving:.1f} s")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--timeout", type=float, default=300.0, help="per failure, seconds")
    ap.add_argument("--vllm-venv", help="a vLLM install (make test-vllm builds .venv-vllm)")
    ap.add_argument("--vllm-model", help="the model folder vllm serve loads")
    ap.add_argument(
        "--hold",
        type=float,
        default=60.0,
        help="seconds the baseline watches a stopped engine that answers /health",
    )
    ap.add_argument("--skip-worker", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kcops-recovery-"))
    figs = []
    if not args.skip_worker:
        figs.append(worker_run(tmp, args.timeout, "enforce"))
        figs.append(worker_run(tmp, args.hold, "dry-run"))
    if args.vllm_venv and args.vllm_model:
        figs.append(vllm_run(tmp, args.vllm_venv, args.vllm_model, args.timeout, "enforce"))
        figs.append(vllm_run(tmp, args.vllm_venv, args.vllm_model, args.hold, "dry-run"))
    report(figs)
    print(f"\nlogs: {tmp}")
    return 0 if all(f.serving is not None for f in figs if f.mode == "enforce") else 1


if __name__ == "__main__":
    sys.exit(main())
