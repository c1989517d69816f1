"""A stalled (and a hung) engine, end to end: a supervised `kcops serve --model tiny
--enable-faults` whose model loop stops (`{"stall": true}`) while `/health` and
`/metrics` still answer and requests stay pending. The agent's stall watch sees no
progress, its canary times out, the engine is `stalled` (readiness 503),
KcopsEngineStalled fires and `restart_worker` kills the tree at once (no drain); the
respawned worker serves again. A hung worker pages KcopsEngineDown and is killed the
same way.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from kcops.alerts import packaged_file
from tests.integration.test_remediation_e2e import AUTH, Stack, stack

pytestmark = pytest.mark.slow


def packaged_rule(name: str) -> dict[str, object]:
    """The shipped rule's expression and ladder (annotations need the shipped params)."""
    doc = yaml.safe_load(packaged_file("rules.yaml").read_text())
    rule = next(r for g in doc["groups"] for r in g["rules"] if r.get("alert") == name)
    return {
        "alert": name,
        "expr": rule["expr"],
        "for": rule["for"],
        "labels": rule["labels"],
        "remediation": rule["remediation"],
    }


def the_incident(s: Stack, run: dict[str, object]) -> dict[str, object]:
    """The one incident the drill opened, as the API serves it, once its capture is on disk."""
    result = run["result"]
    assert isinstance(result, dict) and "incident" in result, run
    listed = httpx.get(f"{s.agent}/api/v1/incidents", headers=AUTH, timeout=10).json()
    assert [i["id"] for i in listed["incidents"]] == [result["incident"]], listed
    url = f"{s.agent}/api/v1/incidents/{result['incident']}"
    return s.until(
        lambda: (r := httpx.get(url, headers=AUTH, timeout=10).json())["parts"] and r,
        30,
        "the incident's parts on disk",
    )


def where_it_hung(rec: dict[str, object]) -> dict[str, object]:
    """The worker's model thread, caught in its loop's wait by the stacks taken before the kill."""
    cap = rec["capture"]
    assert isinstance(cap, dict) and cap["seconds"] <= cap["budget_s"] + 0.5, cap
    procs = rec["processes"]
    assert isinstance(procs, list) and procs, rec
    worker = next(p for p in procs if p["role"] == "kcops worker")
    assert worker["stacks"]["error"] is None, worker
    frames = [f for t in worker["stacks"]["threads"] for f in t["frames"]]
    hung = [f for f in frames if f["name"].endswith("._run") and f["file"].endswith("engine.py")]
    assert hung, [f["name"] for f in frames]
    assert worker["state"] in "RSD" and worker["threads"] >= 2 and worker["rss_bytes"] > 0
    # The engine's last words: the supervisor's ring, across the respawn.
    assert any("engine started: pid" in line for line in rec["output"]), rec["output"]
    return worker


@contextlib.contextmanager
def pending(url: str, n: int = 3) -> Iterator[None]:
    """``n`` completions in flight (they wait in the stalled worker's queue)."""
    threads = []
    for i in range(n):

        def one(i: int = i) -> None:
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(
                    f"{url}/v1/completions",
                    json={"model": "tiny", "prompt": f"pending {i} " * 10, "max_tokens": 8},
                    timeout=120,
                )

        t = threading.Thread(target=one, daemon=True)
        t.start()
        threads.append(t)
    try:
        yield
    finally:
        for t in threads:
            t.join(30)


def stalled_seconds(s: Stack) -> float | None:
    return s.metric("kcops_engine_stalled_seconds")


def test_stalled_worker_is_judged_out_of_rotation_and_restarted(
    tmp_path: Path, redis_url: str
) -> None:
    rules = [packaged_rule("KcopsEngineStalled")]
    with stack(tmp_path, redis_url, rules) as s:
        old_pid = s.state_of_worker()["pid"]
        ready = f"{s.agent}/api/v1/engine/ready"
        s.until(lambda: httpx.get(ready, timeout=5).status_code == 200, 30, "ready")
        assert stalled_seconds(s) is None  # idle: absent
        s.fault({"stall": True})
        t0, wall0 = time.monotonic(), time.time()
        with pending(s.worker):
            # Health still answers while the loop is stopped.
            assert httpx.get(f"{s.worker}/health", timeout=5).status_code == 200
            first = s.until(lambda: stalled_seconds(s), 30, "kcops_engine_stalled_seconds")
            s.until(lambda: (stalled_seconds(s) or 0) > first, 30, "stalled seconds to grow")
            r = s.until(
                lambda: (g := httpx.get(ready, timeout=5)).status_code == 503 and g, 30, "503"
            )
            t_503 = time.monotonic() - t0
            assert r.json()["state"] == "stalled", r.json()
            run = s.until(lambda: s.runs("restart_worker", "ok"), 60, "restart_worker")[0]
        t_restart = time.monotonic() - t0
        # The audit says what was killed and why.
        assert "SIGKILL at once, no drain" in run["detail"], run
        assert "engine stalled for" in run["detail"] and "requests pending" in run["detail"]
        ev = run["result"]["engine"]
        assert ev["state"] == "stalled" and ev["stalled_s"] >= 5 and ev["pending"] >= 1, ev
        assert ev["canary"]["outcome"] == "timeout", ev
        assert run["result"]["drain"] is None and run["result"]["killed"] is True
        assert run["before"]["pid"] == old_pid and run["after"]["pid"] != old_pid
        # Serving again: a completion from the new worker, readiness 200.
        s.until(
            lambda: (
                httpx.post(
                    f"{s.worker}/v1/completions",
                    json={"model": "tiny", "prompt": "again", "max_tokens": 2},
                    timeout=30,
                ).status_code
                == 200
            ),
            120,
            "a completion from the respawned worker",
        )
        t_serving = time.monotonic() - t0
        s.until(lambda: httpx.get(ready, timeout=5).status_code == 200, 60, "ready again")
        assert s.state_of_worker()["pid"] == run["after"]["pid"]
        # The evidence: the stacks before the kill, the timeline once the incident closes.
        where_it_hung(the_incident(s, run))
        url = f"{s.agent}/api/v1/incidents/{run['result']['incident']}"
        rec = s.until(
            lambda: (
                (r := httpx.get(url, headers=AUTH, timeout=10).json())["status"] == "closed" and r
            ),
            60,
            "the incident to close",
        )
        what = [e["what"] for e in rec["timeline"]]
        assert "KcopsEngineStalled firing" in what, what
        assert any(w.startswith("restart_worker ok") for w in what), what
        assert rec["alerts"][0]["alertname"] == "KcopsEngineStalled", rec["alerts"]
        series = httpx.get(f"{url}/export", headers=AUTH, timeout=10)
        assert series.headers["content-type"] == "application/gzip" and len(series.content) > 100
        print(
            f"stall drill: readiness 503 after {t_503:.1f}s, page after "
            f"{run['trigger']['t'] - wall0:.1f}s, restart recorded after {t_restart:.1f}s, "
            f"serving again after {t_serving:.1f}s: {run['detail']}"
        )


def test_hung_worker_pages_within_seconds_and_is_killed_without_a_drain(
    tmp_path: Path, redis_url: str
) -> None:
    """The shipped KcopsEngineDown (for 5s) on a hung worker (loop and /health stop):
    the page, then restart_worker without the drain a hung engine cannot do."""
    with stack(tmp_path, redis_url, [packaged_rule("KcopsEngineDown")]) as s:
        old_pid = s.state_of_worker()["pid"]
        s.fault({"hang": True})
        t0, wall0 = time.monotonic(), time.time()
        run = s.until(lambda: s.runs("restart_worker", "ok"), 60, "restart_worker")[0]
        t_restart = time.monotonic() - t0
        to_page = run["trigger"]["t"] - wall0
        # How soon (printed, not asserted: no timed assertions): the rule's `for` is
        # tested by promtool at 1 s resolution (alerts/tests/engine_down.yaml).
        assert "SIGKILL at once, no drain" in run["detail"] and "engine hung" in run["detail"]
        assert run["result"]["engine"]["state"] == "hung" and run["result"]["drain"] is None
        assert run["before"]["pid"] == old_pid and run["after"]["pid"] != old_pid
        s.until(
            lambda: (
                httpx.post(
                    f"{s.worker}/v1/completions",
                    json={"model": "tiny", "prompt": "again", "max_tokens": 2},
                    timeout=30,
                ).status_code
                == 200
            ),
            120,
            "a completion from the respawned worker",
        )
        t_serving = time.monotonic() - t0
        rec = the_incident(s, run)
        assert rec["trigger"] == "KcopsEngineDown" and rec["alerts"][0]["state"] != "pending", rec
        where_it_hung(rec)
        print(
            f"hang drill: page after {to_page:.1f}s, restart recorded after {t_restart:.1f}s "
            f"(it took {run['duration_s']:.2f}s), serving again after {t_serving:.1f}s"
        )
