"""``kill -9`` of a real agent while each action kind is in flight (issue 24).

For every action of the registry, a real agent in enforce mode runs it (``POST
/api/v1/actions/<name>``) against a real peer on 127.0.0.1 whose acting call does
not answer; once that call has arrived, the agent gets SIGKILL after a random delay
inside the hang. Then: the audit log is whole JSON lines, it holds the run's
``started`` record and no outcome for it; an agent restarted on the same state
dir writes exactly one ``interrupted`` outcome for the run, and one started after it
writes none again.

How each action is held in flight (the call that hangs):

- ``evict_cache``, ``fallback_to_base``, ``restore_route``, ``lower_topn``,
  ``raise_topn``: a stand-in of the kcops worker's admin API (ThreadingHTTPServer,
  the routes and answers of ``worker/admin.py`` as ``tests/unit/actions/fakeworker.py``
  has them) that delays ``POST /admin/cache/evict``, ``/admin/route`` and
  ``/admin/attention``. The real worker cannot be made to hang there: its ``hang``
  fault gates ``/health`` and the request routes, not ``/admin/*`` (see
  ``worker/state.py:hang_gate``), and no other honest fault delays them.
- ``evict_pod``: a stand-in Kubernetes API that delays ``POST .../pods/<pod>/eviction``.
- ``scale_out`` (no fleet lease, ``actions.scale.deployment``): the same stand-in
  answers ``GET .../deployments/<d>/scale`` and delays the ``PATCH``.
- ``restart_worker`` in ``signal`` mode: a real engine process that ignores SIGTERM
  (an engine whose drain is slow); the agent waits ``grace_s`` for it to exit.
  Kubernetes mode would hang in the same eviction call as ``evict_pod``.
- ``notify``: a webhook that delays its answer.

None was left out: every kind could be held with a real peer that is slow to answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from kcops.agent.actions.registry import builtin_actions
from kcops.agent.remediation.auditread import read_audit
from tests.faults.conftest import RealAgent, start_agent, stop_agent
from tests.faults.test_audit_disk import check_log

pytestmark = pytest.mark.slow

HANG_S = 4.0  # how long the acting call stays unanswered
KILL_WITHIN_S = 3.0  # the kill comes uniformly within this much of the call's arrival
ENGINE_ACTIONS = ("evict_cache", "fallback_to_base", "restore_route", "lower_topn", "raise_topn")
KINDS = (*ENGINE_ACTIONS, "restart_worker", "evict_pod", "scale_out", "notify")

WORKER_STATE = {
    "pid": os.getpid(),  # the stand-in's own process (the agent watches it)
    "model": "tiny",
    "route_mode": "normal",
    "top_n": 64,
    "top_n_bounds": [16, 256],
    "admitting": True,
    "in_flight": 0,
    "cache": {"blocks": 100, "usage_ratio": 0.5},
    "faults": {"enabled": False},
}


@dataclass
class Hang:
    """The acting call: when it arrived, whether it was answered; ``release`` ends it."""

    acting: tuple[str, str]  # method, path suffix
    arrived: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    arrived_at: float | None = None
    answered_at: float | None = None
    calls: list[tuple[str, str]] = field(default_factory=list)


def _answer(method: str, path: str, body: Any) -> Any:
    """What the worker, the Kubernetes API or the webhook says (mimicked)."""
    if path == "/health":
        return {"status": "ok"}
    if path == "/admin/state":
        return WORKER_STATE
    if path == "/admin/cache/evict":
        cache = WORKER_STATE["cache"]
        return {"policy": body["policy"], "evicted_blocks": 0, "freed_bytes": 0} | {
            "before": cache,
            "after": cache,
        }
    if path == "/admin/route":
        return {"before": WORKER_STATE["route_mode"], "after": body["mode"]}
    if path == "/admin/attention":
        return {"before": {"top_n": WORKER_STATE["top_n"]}, "after": {"top_n": body["top_n"]}}
    if path.endswith("/scale"):
        replicas = body["spec"]["replicas"] if method == "PATCH" else 2
        return {"kind": "Scale", "apiVersion": "autoscaling/v1", "spec": {"replicas": replicas}}
    return {"ok": True}


def _handler(hang: Hang) -> type[BaseHTTPRequestHandler]:
    class Peer(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            body = json.loads(raw) if raw else None
            path = self.path.split("?", 1)[0]
            hang.calls.append((self.command, path))
            if (self.command, True) == (hang.acting[0], path.endswith(hang.acting[1])):
                hang.arrived_at = time.monotonic()
                hang.arrived.set()
                hang.release.wait(HANG_S)
                hang.answered_at = time.monotonic()
            if path == "/metrics":
                out, ctype = b"", "text/plain; version=0.0.4"
            else:
                out, ctype = (
                    json.dumps(_answer(self.command, path, body)).encode(),
                    "application/json",
                )
            with contextlib.suppress(OSError):  # the agent may be gone
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        do_GET = do_POST = do_PATCH = _serve

        def log_message(self, *args: object) -> None:
            pass

    return Peer


@contextlib.contextmanager
def peer(hang: Hang) -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hang))
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        hang.release.set()
        srv.shutdown()
        srv.server_close()


# An engine that ignores SIGTERM (a slow drain); it writes when it got one.
SLOW_ENGINE = (
    "import pathlib, signal, sys, time\n"
    "mark = pathlib.Path(sys.argv[1])\n"
    "signal.signal(signal.SIGTERM, lambda *_: mark.write_text(repr(time.monotonic())))\n"
    "print('up', flush=True)\n"
    "while True:\n"
    "    time.sleep(0.02)\n"
)


@dataclass
class Setup:
    extra: dict[str, object]
    arrived: Callable[[], float | None]  # monotonic time the acting call arrived
    in_flight: Callable[[], bool]  # the acting call is still unanswered
    engine_ready: bool = False


def _kube(url: str, tmp: Path) -> dict[str, object]:
    token = tmp / "sa-token"
    token.write_text("sa-secret\n")
    return {
        "api_url": url,
        "token_file": str(token),
        "ca_file": None,
        "namespace": "serving",
        "pod_name": "llm-0",
        "timeout_s": 30.0,
    }


def _guards() -> dict[str, object]:
    return {
        "cooldown_s": 0,
        "budget_per_hour": 100_000,
        "action_budget_per_hour": 100_000,
        "action_timeout_s": 120.0,
    }


def _http_setup(kind: str, url: str, hang: Hang, tmp: Path) -> Setup:
    actions: dict[str, object] = {"mode": "enforce", "guards": _guards()}
    extra: dict[str, object] = {"actions": actions}
    if kind in ENGINE_ACTIONS:
        extra["engine"] = {"url": url, "adapter": "kcops", "timeout_s": 30.0}
    elif kind == "evict_pod":
        actions["kubernetes"] = _kube(url, tmp)
    elif kind == "scale_out":
        actions["kubernetes"] = _kube(url, tmp)
        actions["scale"] = {"deployment": "llm", "max_replicas": 4}
    else:
        actions["notify"] = {"url": url + "/hook", "timeout_s": 30.0}
    return Setup(
        extra,
        arrived=lambda: hang.arrived_at if hang.arrived.is_set() else None,
        in_flight=lambda: hang.answered_at is None,
        engine_ready=kind in ENGINE_ACTIONS,
    )


ACTING = {
    "evict_cache": ("POST", "/admin/cache/evict"),
    "fallback_to_base": ("POST", "/admin/route"),
    "restore_route": ("POST", "/admin/route"),
    "lower_topn": ("POST", "/admin/attention"),
    "raise_topn": ("POST", "/admin/attention"),
    "evict_pod": ("POST", "/pods/llm-0/eviction"),
    "scale_out": ("PATCH", "/deployments/llm/scale"),
    "notify": ("POST", "/hook"),
}


@contextlib.contextmanager
def held(kind: str, tmp: Path) -> Iterator[Setup]:
    """The agent's configuration for ``kind`` and the peer that holds its acting call."""
    if kind != "restart_worker":
        hang = Hang(ACTING[kind])
        with peer(hang) as url:
            yield _http_setup(kind, url, hang, tmp)
        return
    mark = tmp / "sigterm-at"
    engine = subprocess.Popen(
        [sys.executable, "-c", SLOW_ENGINE, str(mark)], stdout=subprocess.PIPE
    )
    try:
        assert engine.stdout is not None and engine.stdout.readline() == b"up\n"

        def arrived() -> float | None:
            return float(mark.read_text()) if mark.exists() and mark.read_text() else None

        yield Setup(
            {
                "engine": {"pid": engine.pid},
                "actions": {
                    "mode": "enforce",
                    "guards": _guards(),
                    "restart": {"mode": "signal", "grace_s": HANG_S},
                },
            },
            arrived=arrived,
            in_flight=lambda: engine.poll() is None,  # the agent SIGKILLs it after grace_s
        )
    finally:
        engine.kill()
        engine.wait()


def _wait(what: str, fn: Callable[[], Any], timeout_s: float, agent: RealAgent) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = fn()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: {agent.log.read_text()[-2000:]}"
        time.sleep(0.005)


def _engine_state(agent: RealAgent) -> str:
    r = httpx.get(agent.url + "/api/v1/status", timeout=5).json()
    return str(r["engine"]["state"])


def _post(agent: RealAgent, kind: str) -> None:
    params = {"message": "kill -9 test"} if kind == "notify" else {}
    body = {"params": params, "force": True, "reason": "fault test"}
    with contextlib.suppress(httpx.HTTPError):  # the agent dies under it
        httpx.post(
            f"{agent.url}/api/v1/actions/{kind}", json=body, headers=agent.headers(), timeout=60
        )


def test_the_kinds_are_the_registry() -> None:
    assert sorted(KINDS) == builtin_actions().names()


@pytest.mark.parametrize("kind", KINDS)
def test_kill9_while_each_action_runs_leaves_started_then_one_interrupted(
    kind: str, tmp_path: Path
) -> None:
    seed = random.randrange(1 << 30)
    delay = random.Random(seed).uniform(0.0, KILL_WITHIN_S)
    with held(kind, tmp_path) as setup:
        agent = start_agent(tmp_path, extra=setup.extra)
        audit = agent.state_dir / "audit.jsonl"
        try:
            if setup.engine_ready:  # an engine action is refused while the engine starts
                _wait("engine ready", lambda: _engine_state(agent) == "ready", 20, agent)
            t0 = time.monotonic()
            threading.Thread(target=_post, args=(agent, kind), daemon=True).start()

            def started() -> list[dict[str, Any]]:
                if not audit.exists():
                    return []
                return [r for r in read_audit(audit) if r["kind"] == "started"]

            recs = _wait("a started record", started, 20, agent)
            on_disk_s = time.monotonic() - t0
            arrived_at = _wait("the acting call", setup.arrived, 20, agent)
            time.sleep(max(0.0, arrived_at + delay - time.monotonic()))
            assert setup.in_flight(), f"{kind}: answered before the kill (seed {seed})"
            agent.proc.kill()
            agent.proc.wait()
            killed_after_s = time.monotonic() - arrived_at
            assert setup.in_flight(), f"{kind}: answered before the kill (seed {seed})"
        finally:
            stop_agent(agent)
        first_log = agent.log.read_text()
        assert [(r["action"], r["mode"]) for r in recs] == [(kind, "enforce")], recs
        rid = recs[0]["run_id"]
        after_kill = check_log(audit)  # whole JSON lines, nothing torn
        assert [r["run_id"] for r in after_kill if r["kind"] == "started"] == [rid]
        assert not [r for r in after_kill if r["kind"] == "action"], after_kill  # never finished

        agent = start_agent(tmp_path, extra=setup.extra)  # same state dir
        try:
            ends = _wait(
                "an interrupted record",
                lambda: [r for r in read_audit(audit) if r["kind"] == "action"],
                10,
                agent,
            )
        finally:
            stop_agent(agent)
        second_log = agent.log.read_text()
        agent = start_agent(tmp_path, extra=setup.extra)  # once more: nothing written again
        stop_agent(agent)
        final = check_log(audit)
    assert [r for r in final if r["kind"] == "action"] == ends  # nothing more after two starts
    assert [(r["run_id"], r["action"], r["outcome"]) for r in ends] == [
        (rid, kind, "interrupted")
    ], (seed, ends)
    assert "Traceback" not in first_log + second_log + agent.log.read_text()
    print(
        f"\nkill -9 during {kind}: started record on disk {on_disk_s * 1000:.0f} ms after the "
        f"POST; acting call held, agent killed {killed_after_s:.2f} s into it (seed {seed}); "
        f"after restart: one {ends[0]['outcome']} record for run {rid}, none more after another"
    )
