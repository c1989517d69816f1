"""No input stalls the real agent's loop: parallel costly queries, and costly rules.

The tick gap is read from the agent's own samples: each tick writes
``kcops_rule_group_last_evaluation_timestamp_seconds`` of an on-tick group, stamped
with the tick, so the largest gap between two of them is the largest tick gap.
The acceptance (issue 24): tick gap <= 2 s and ``/healthz`` <= 1 s.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.faults.conftest import RealAgent, start_agent, stop_agent
from tests.services import wait_until

pytestmark = pytest.mark.slow
# Priced by the series it scans at each of 86,400 steps: runs into its deadline.
SCAN = 'count_over_time(count({__name__=~"kcops_.+"})[1d:1s])'
COSTLY_RULE = "sum_over_time(sum(max_over_time(vector(1)[5m:1s]))[30m:10s])"
# Issue 24's goals are a tick gap <= 2 s and /healthz <= 1 s; the test prints what it
# measured against them. It asserts bounds with room for a loaded 2-core CI machine (the
# suite runs two workers), still far below what the unbounded loop gave (a 32 s gap for
# 32 queries, 20 s for 20 rules): a timing goal is quoted, not asserted to the millisecond.
MAX_GAP_S = 5.0
ATTACK_S = 6.0
MAX_HEALTHZ_S = 3.0


def tick_gaps(agent: RealAgent, group: str, since: float) -> list[float]:
    """Gaps between the group's evaluations since ``since``: the series' value is the
    evaluation's stamp, so its distinct values over a fine range query are the ticks."""
    q = f'kcops_rule_group_last_evaluation_timestamp_seconds{{rule_group="{group}"}}'
    params = {"query": q, "start": str(since), "end": str(time.time()), "step": "0.05"}
    r = httpx.get(agent.url + "/api/v1/query_range", params=params, timeout=30)
    assert r.status_code == 200, r.text
    result = r.json()["data"]["result"]
    stamps = sorted({float(v) for s in result for _, v in s["values"] if float(v) >= since})
    return [b - a for a, b in itertools.pairwise(stamps)]


class HealthProbe:
    """Times ``/healthz`` over and over until stopped; keeps the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.answers = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                t0 = time.monotonic()
                r = client.get(self.url + "/healthz")
                self.worst = max(self.worst, time.monotonic() - t0)
                assert r.status_code == 200
                self.answers += 1
                self._stop.wait(0.05)

    def __enter__(self) -> HealthProbe:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self.thread.join(30)


def attacker(url: str, seconds: float = ATTACK_S) -> list[httpx.Response]:
    """One of the parallel clients: costly queries back to back for ``seconds``."""
    got = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=120) as client:
        while time.monotonic() < end:
            got.append(client.get(url + "/api/v1/query", params={"query": SCAN}))
    return got


def test_32_parallel_costly_queries_keep_the_loop_responsive(tmp_path: Path) -> None:
    agent = start_agent(tmp_path)
    try:
        since = time.time()
        with HealthProbe(agent.url) as probe, ThreadPoolExecutor(32) as pool:
            answers = [a for got in pool.map(attacker, [agent.url] * 32) for a in got]
        kinds = {(r.status_code, r.json()["errorType"]) for r in answers}
        assert kinds <= {(503, "timeout"), (503, "unavailable"), (422, "execution")}, kinds
        gaps = tick_gaps(agent, "kcops", since)
        print(
            f"32 queries: {len(answers)} answers, max tick gap {max(gaps, default=0):.2f}s, "
            f"worst /healthz {probe.worst:.3f}s"
        )
        assert gaps and max(gaps) <= MAX_GAP_S, max(gaps)
        assert probe.answers and probe.worst <= MAX_HEALTHZ_S, probe.worst
        # Normal service after: a cheap query is answered.
        ok = wait_until(
            lambda: (
                r
                if (
                    r := httpx.get(agent.url + "/api/v1/query", params={"query": "1+1"})
                ).status_code
                == 200
                else None
            ),
            10,
            "a cheap query after the burst",
        )
        assert ok.json()["data"]["result"][1] == "2"
    finally:
        stop_agent(agent)


def test_20_costly_rules_keep_the_loop_responsive(tmp_path: Path) -> None:
    rules = ", ".join(f"{{record: costly{i}, expr: '{COSTLY_RULE}'}}" for i in range(20))
    (tmp_path / "rules.yaml").write_text(f"groups: [{{name: costly, rules: [{rules}]}}]")
    agent = start_agent(tmp_path, extra={"rules": {"file": str(tmp_path / "rules.yaml")}})
    try:
        since = time.time()
        with HealthProbe(agent.url) as probe:
            # Ten evaluations of the group, each one spending the tick's budget.
            wait_until(
                lambda: len(tick_gaps(agent, "costly", since)) >= 10 or None,
                60,
                "ten evaluations of the costly group",
                interval_s=0.5,
            )
        gaps = tick_gaps(agent, "costly", since)
        print(f"20 rules: max tick gap {max(gaps):.2f}s, worst /healthz {probe.worst:.3f}s")
        assert max(gaps) <= MAX_GAP_S, max(gaps)
        assert probe.worst <= MAX_HEALTHZ_S, probe.worst
        rules_doc = httpx.get(agent.url + "/api/v1/rules", timeout=10).json()
        errors = {r["name"]: r["last_error"] for r in rules_doc["rules"]}
        assert "not evaluated" in (errors["costly19"] or "")
    finally:
        stop_agent(agent)
