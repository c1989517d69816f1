"""Memory with a bound, against a real agent: regex churn through the query API, template bombs.

Issue 24 class 2: distinct large regexes took the agent's RSS from 73 to 523 MB
after about 130 queries, and one ``printf`` width in an annotation to 2.4 GB.
The acceptance: 500 distinct large regexes raise RSS by <= 64 MB, and a
template bomb renders bounded output in <= 100 ms. The tests print what they
measured against these goals; the time is asserted with room for a loaded
2-core CI machine.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.faults.conftest import RealAgent, start_agent, stop_agent
from tests.faults.test_loop_stall import HealthProbe
from tests.services import wait_until

pytestmark = pytest.mark.slow
MAX_RSS_RISE_BYTES = 64 * 2**20
TEMPLATE_GOAL_S = 0.1
MAX_TEMPLATE_S = 1.0
MAX_OUTPUT_BYTES = 64 * 1024


def large_regex(i: int) -> str:
    """A distinct regex of 8,000 RE2 instructions (about 0.6 MB compiled and matched);
    every tenth of 120,000 (about 1.7 MB)."""
    return rf"\pL{{100}}|k{i}" if i % 10 == 0 else rf"(?i)\w{{1000}}|k{i}"


def query(client: httpx.Client, text: str) -> httpx.Response:
    """The answer to ``text``, retried with back-off while the query API is busy (503):
    its share of the loop refills at 0.5 s per second, so waiting lets a query that
    needs more of it than one retry's refill through."""
    deadline = time.monotonic() + 60
    pause = 0.05
    while True:
        r = client.get("/api/v1/query", params={"query": text})
        if r.status_code != 503 or time.monotonic() > deadline:
            return r
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def gauge(agent: RealAgent, name: str) -> float:
    r = httpx.get(agent.url + "/api/v1/query", params={"query": name}, timeout=10)
    result = r.json()["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def test_500_distinct_large_regexes_raise_rss_by_at_most_64_mb(tmp_path: Path) -> None:
    agent = start_agent(tmp_path)
    try:
        with httpx.Client(base_url=agent.url, timeout=60) as client:
            for i in range(20):  # the query path warmed up, with small regexes
                query(client, f'count({{__name__=~"warm{i}|kcops_.*"}})')
            before = agent.rss_bytes()
            t0 = time.monotonic()
            for i in range(500):
                r = query(client, f"count({{__name__=~`{large_regex(i)}`}})")
                assert r.status_code == 200, r.text
            took = time.monotonic() - t0
            after = agent.rss_bytes()
        # The self metrics of a tick after the churn: the cache has evicted by then.
        wait_until(
            lambda: gauge(agent, "kcops_regex_cache_evictions_total") > 0 or None,
            30,
            "the regex cache's metrics",
        )
        cache_mb = gauge(agent, "kcops_regex_cache_bytes") / 2**20
        bound_mb = gauge(agent, "kcops_regex_cache_max_bytes") / 2**20
        rise = after - before
        print(
            f"500 distinct large regexes in {took:.1f}s: RSS {before / 2**20:.1f} -> "
            f"{after / 2**20:.1f} MB (+{rise / 2**20:.1f} MB; goal <= 64), regex cache "
            f"{cache_mb:.1f} of {bound_mb:.0f} MiB"
        )
        assert rise <= MAX_RSS_RISE_BYTES, rise
        assert cache_mb <= bound_mb
    finally:
        stop_agent(agent)


def test_a_query_of_many_large_regexes_stops_compiling_at_its_deadline(tmp_path: Path) -> None:
    # 180 distinct programs of 120,000 instructions: 70 ms each to compile, holding the
    # GIL; compiled all at once they held the loop for about 13 s.
    matchers = ", ".join(f"a=~`\\pL{{100}}x{i}`" for i in range(180))
    text = f"count({{{matchers}}})"
    assert len(text) <= 4000
    agent = start_agent(tmp_path)
    try:
        with HealthProbe(agent.url) as probe:
            time.sleep(0.3)
            t0 = time.monotonic()
            r = httpx.get(agent.url + "/api/v1/query", params={"query": text}, timeout=120)
            took = time.monotonic() - t0
            time.sleep(0.3)
        print(
            f"a query of 180 large regexes: {r.status_code} in {took:.2f}s, "
            f"worst /healthz {probe.worst:.3f}s"
        )
        assert r.status_code == 503 and r.json()["errorType"] == "timeout", r.text
        assert "compiling its regexes" in r.json()["error"]
        assert took <= 5.0 and probe.worst <= 3.0, (took, probe.worst)
    finally:
        stop_agent(agent)


BOMBS = {
    "go_gives_up": '{{ printf "%999999999d" 1 }}',
    "width": '{{ printf "%10000000d" 1 }}',  # Go pads to ten million characters
    "precision": '{{ printf "%.9999999f" $value }}',
    "parts": '{{ printf "%65536d" 1 }}' * 100,
    "nested": '{{ printf "' + "%s" * 30 + '" ' + " ".join(['(printf "%65536d" 1)'] * 30) + " }}",
}


def test_a_template_bomb_renders_bounded_output_quickly(tmp_path: Path) -> None:
    ann = "\n".join(f"        {k}: '{v}'" for k, v in BOMBS.items())
    (tmp_path / "rules.yaml").write_text(
        "groups:\n- name: bombs\n  rules:\n  - alert: TemplateBomb\n    expr: vector(1)\n"
        f"    annotations:\n{ann}\n"
    )
    agent = start_agent(tmp_path, extra={"rules": {"file": str(tmp_path / "rules.yaml")}})
    try:
        before = agent.rss_bytes()

        def firing() -> dict[str, str] | None:
            alerts = httpx.get(agent.url + "/api/v1/alerts", timeout=10).json()["alerts"]
            got = [a for a in alerts if a["alertname"] == "TemplateBomb"]
            return got[0]["annotations"] if got else None

        annotations = wait_until(firing, 30, "the bomb alert")
        wait_until(lambda: len(rule_times(agent)) >= 1 or None, 30, "a timed evaluation")
        times = []
        for _ in range(10):  # ten evaluations, each rendering every bomb
            times.append(max(rule_times(agent)))
            time.sleep(0.25)
        rise = agent.rss_bytes() - before
        sizes = {k: len(v.encode()) for k, v in annotations.items()}
        print(
            f"template bombs: annotation bytes {sizes}, worst evaluation {max(times) * 1000:.1f} "
            f"ms (goal <= {TEMPLATE_GOAL_S * 1000:.0f}), RSS +{rise / 2**20:.1f} MB"
        )
        assert all(n <= MAX_OUTPUT_BYTES for n in sizes.values()), sizes
        assert annotations["go_gives_up"] == "%!(NOVERB)%!(EXTRA int=1)"
        assert annotations["parts"].endswith("bytes]")
        assert annotations["nested"].startswith("<error expanding template:")
        assert max(times) <= MAX_TEMPLATE_S, times
        assert rise <= MAX_RSS_RISE_BYTES, rise
    finally:
        stop_agent(agent)


def rule_times(agent: RealAgent) -> list[float]:
    """The last evaluation's duration of the bomb rule: its expression and its templates."""
    doc = httpx.get(agent.url + "/api/v1/rules", timeout=10).json()
    return [
        float(r["evaluation_seconds"])
        for r in doc["rules"]
        if r["name"] == "TemplateBomb" and r["last_evaluation"] is not None
    ]
