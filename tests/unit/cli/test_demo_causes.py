"""The demo's drill causes: the Redis delay proxy and the worker's memory cgroup.

The proxy is tested against a real redis-server; the cgroup against a captured
tree, and against the kernel where this machine lets a test create one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from kcops.demo import causes as drill_causes
from kcops.demo import cgroup as demo_cgroup
from kcops.demo.drills import DRILLS
from kcops.demo.env import DEMO_TOPN_MAX, DemoFailed
from kcops.demo.proxy import DelayProxy


def test_every_drill_has_a_real_cause() -> None:
    # No known gap left: KcopsBudgetMismatch's cause (N far over the live K(C)
    # recommendation) has a recommendation within the demo's minutes.
    assert [d.alert for d in DRILLS if d.needs is not None] == []
    assert all(d.estimate_s > 0 and d.fire_within_s > 0 for d in DRILLS)


class _BudgetEnv:
    """What the budget-mismatch drill asks of DemoEnv: the agent's gauge, the worker's N."""

    def __init__(self, recommended: float | None, params: dict[str, object]) -> None:
        self.recommended = recommended
        self.rule_params = params
        self.posted: list[tuple[str, dict[str, object]]] = []

    def query(self, expr: str) -> float | None:
        assert expr == drill_causes.RECOMMENDED_N
        return self.recommended

    def admin(self, path: str, body: dict[str, object]) -> None:
        self.posted.append((path, body))


def test_the_budget_drill_sets_n_past_the_rule_from_the_live_recommendation() -> None:
    # The shipped ratio (4, the demo keeps it): N = 2 x 4 x the recommendation.
    env = _BudgetEnv(48.0, {})
    drill_causes.over_budget(env)  # type: ignore[arg-type]
    assert env.posted == [("/admin/attention", {"top_n": 384})]
    assert drill_causes.budget_over_ratio(env) * 48 < 384  # type: ignore[arg-type]
    # A ratio the demo's params override is the one the rule uses.
    env = _BudgetEnv(48.0, {"budget_over_ratio": 3})
    drill_causes.over_budget(env)  # type: ignore[arg-type]
    assert env.posted == [("/admin/attention", {"top_n": 288})]
    # Past the worker's --topn-max the cause cannot be applied: said, nothing posted.
    env = _BudgetEnv(float(DEMO_TOPN_MAX), {})
    with pytest.raises(DemoFailed, match="topn-max"):
        drill_causes.over_budget(env)  # type: ignore[arg-type]
    assert env.posted == []


def test_the_budget_drill_waits_for_a_recommendation_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(drill_causes, "RECOMMENDATION_WITHIN_S", 0.2)
    env = _BudgetEnv(None, {})  # too few samples: the agent exports no gauge
    with pytest.raises(DemoFailed, match=r"kcops_kc_recommended_n.*not within"):
        drill_causes.await_recommendation(env)  # type: ignore[arg-type]
    assert env.posted == []


def test_proxy_forwards_and_delays(redis_url: str) -> None:
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    with DelayProxy("127.0.0.1", port) as proxy:
        client = redis.Redis(host="127.0.0.1", port=proxy.port)
        big = os.urandom(3 * 1024**2)  # many TCP segments: one burst, one delay
        client.set("k", big)
        assert client.get("k") == big
        assert proxy.bursts_delayed == 0
        proxy.delay_s = 0.15
        t0 = time.monotonic()
        assert client.get("k") == big
        assert time.monotonic() - t0 >= 0.15  # a lower bound: the sleep happened
        assert proxy.bursts_delayed == 1
        proxy.delay_s = 0.0
        client.set("k", b"small")
        assert client.get("k") == b"small" and proxy.bursts_delayed == 1
        client.close()


def test_proxy_refuses_a_negative_delay() -> None:
    with pytest.raises(ValueError, match="delay_s"):
        DelayProxy("127.0.0.1", 1, delay_s=-1)


def _v1_tree(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    own = root / "memory" / "pod" / "job"
    own.mkdir(parents=True)
    proc = tmp_path / "self-cgroup"
    proc.write_text("4:memory:/pod/job\n0::/\n")
    return root, proc


def test_create_in_a_v1_tree(tmp_path: Path) -> None:
    root, proc = _v1_tree(tmp_path)
    # The kernel fills a new cgroup's files; a plain directory does not: refused, removed.
    with pytest.raises(demo_cgroup.NoCgroup, match="no writable memory limit"):
        demo_cgroup.create("demo", root, proc)
    assert not (root / "memory" / "pod" / "job" / "demo").exists()


def test_limit_oom_count_and_wrap(tmp_path: Path) -> None:
    d = tmp_path / "cg"
    d.mkdir()
    (d / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    (d / "memory.memsw.limit_in_bytes").write_text("9223372036854771712\n")
    (d / "cgroup.procs").write_text("")
    cg = demo_cgroup.MemoryCgroup(d, v2=False)
    assert cg.limit_bytes() is None  # v1's "unlimited"
    cg.set_limit(1 << 30)
    assert cg.limit_bytes() == 1 << 30 and cg.oom_kills() == 3
    # Swap is limited too: with swap on, a RAM-only limit pages the worker out
    # instead of OOM-killing it (CI's machine did; the real test below catches it).
    assert (d / "memory.memsw.limit_in_bytes").read_text() == str(1 << 30)
    # The wrapper writes its own pid, then exec keeps that pid for the command.
    out = subprocess.run(
        cg.wrap([sys.executable, "-c", "import os; print(os.getpid())"]),
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert (d / "cgroup.procs").read_text().strip() == out.stdout.strip()


def test_a_real_cgroup_limit_is_enforced_by_the_kernel() -> None:
    try:
        cg = demo_cgroup.create(f"kcops-test-{uuid.uuid4().hex[:8]}")
    except (demo_cgroup.NoCgroup, OSError) as exc:
        pytest.skip(f"no writable memory cgroup here: {exc}")
    try:
        cg.set_limit(64 * 1024**2)
        before = cg.oom_kills()
        grab = "b = bytearray(b'x') * (256 * 1024**2); print('survived')"
        p = subprocess.run(cg.wrap([sys.executable, "-c", grab]), capture_output=True, text=True)
        assert p.returncode == -signal.SIGKILL and "survived" not in p.stdout
        assert cg.oom_kills() == before + 1
    finally:
        cg.remove()


@pytest.mark.parametrize("baseline_s", [0.2, 1.0, 4.0, 15.0, 60.0, 300.0])
def test_the_fluctuation_drill_moves_the_mean_past_the_rule_whatever_the_baseline(
    baseline_s: float,
) -> None:
    """KcopsLatencyFluctuation: |mean(1m) / mean(10m) - 1| > 0.2. With the delay on, the 1m
    mean is baseline + delay; the 10m baseline is a mix. The drill's delay must keep the
    ratio over 0.2 until half the baseline's requests are delayed, on a quiet machine and
    on a loaded one (a fixed 3 s did not fire at a 15 s mean)."""
    from kcops.demo.causes import FLUCTUATION_MS, fluctuation_ms
    from kcops.worker.faults import MAX_LATENCY_MS

    delay = fluctuation_ms(baseline_s) / 1000
    assert FLUCTUATION_MS / 1000 <= delay <= MAX_LATENCY_MS / 1000
    delayed_share = 0.5
    ratio = (baseline_s + delay) / (baseline_s + delayed_share * delay) - 1
    if delay < MAX_LATENCY_MS / 1000:  # a capped delay can only do what the cap allows
        assert ratio > 0.2, (baseline_s, delay, ratio)
    assert fluctuation_ms(None) == fluctuation_ms(0.0) == FLUCTUATION_MS  # no traffic yet
    fixed = FLUCTUATION_MS / 1000
    assert baseline_s <= 6 or (baseline_s + fixed) / (baseline_s + delayed_share * fixed) - 1 < 0.2


def test_a_drill_whose_rule_compares_with_a_baseline_waits_for_history() -> None:
    """A rule over ``${baseline_window}`` compares the cause with itself when the window
    holds no load from before it: the drill must ask for history first."""
    import yaml

    from kcops.demo.drills import DEMO_PARAMS

    doc = yaml.safe_load(Path("alerts/rules.yaml").read_text())
    rules = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    baseline = {r["alert"] for r in rules if "${baseline_window}" in r["expr"]}
    assert baseline >= {"KcopsLatencyFluctuation", "KcopsKCSurge"}
    window_s = int(str(DEMO_PARAMS["baseline_window"]).rstrip("m")) * 60
    # |x / baseline - 1|: the recovery reads as a fluctuation until the window passes it
    both_ways = {r["alert"] for r in rules if "abs(" in r["expr"]} & baseline
    assert "KcopsLatencyFluctuation" in both_ways
    for drill in DRILLS:
        if drill.alert in baseline and drill.needs is None:
            assert drill.history_s >= window_s / 3, drill.alert
        if drill.alert in both_ways:
            assert drill.settle_s >= window_s + 60, drill.alert


def test_settling_waits_for_a_baseline_drill_past_its_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kcops.demo import drills

    class Env:
        def __init__(self) -> None:
            self.asked = 0

        def alert_state(self, alert: str) -> str:
            self.asked += 1
            return "firing" if self.asked < 3 else "inactive"

    res = drills.DrillResult("KcopsLatencyFluctuation", fired=True)
    res.settle_by = time.time() + 30
    seen: list[float] = []
    real = drills.wait

    def spy(what: str, timeout_s: float, *a: object, **k: object) -> object:
        seen.append(timeout_s)
        return real(what, timeout_s, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(drills, "wait", spy)
    drills.settle(Env(), [res], timeout_s=5)  # type: ignore[arg-type]
    assert res.resolved and 25 < seen[0] <= 30


def test_the_demo_agent_has_a_calibrated_live_recommendation_within_minutes(
    tmp_path: Path,
) -> None:
    from kcops.agent.config import parse_config
    from kcops.agent.kcrec.calibration import coverage_for
    from kcops.demo.env import PROBE_SAMPLE_RATE, DemoEnv

    env = DemoEnv(tmp_path, "smollm2")
    try:
        cfg = parse_config(env.agent_config()).recommendation
    finally:
        env._stop_all()  # the webhook the config names
    # Shipped: every 10 min over 1 h, 200 samples a layer. The demo's: within minutes.
    assert cfg.enabled and cfg.interval_s <= 60 and cfg.window_s <= 600
    assert cfg.min_samples <= 100 and PROBE_SAMPLE_RATE >= 0.1
    cov = coverage_for(cfg, "smollm2")
    assert cov.calibrated and (cov.p, cov.quantile) == (0.9, 0.0625)
    # Another model is not SmolLM2's sweep: uncalibrated, and the document says so.
    env = DemoEnv(tmp_path, "tiny")
    try:
        cfg = parse_config(env.agent_config()).recommendation
    finally:
        env._stop_all()
    assert not coverage_for(cfg, cfg.model).calibrated


class _MemoryEnv:
    """The agent's view of the worker's memory, one reading per query, then the last."""

    cgroup = None

    def __init__(self, used: list[float], total: float) -> None:
        self.used, self.total = list(used), total

    def query(self, expr: str) -> float | None:
        if "total" in expr:
            return self.total
        return self.used.pop(0) if len(self.used) > 1 else self.used[0]


@pytest.fixture
def quick_ramp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drill_causes, "RAMP_POLL_S", 0.01)
    monkeypatch.setattr(drill_causes, "RAMP_STILL_S", 0.1)


def test_the_ramp_starts_from_memory_after_the_last_drills_drop(quick_ramp: None) -> None:
    # The drill before gave back its cache tier as this one began: 65% fell to 57%.
    env = _MemoryEnv([1300.0, 1302.0, 1150.0, 1149.0, 1151.0], total=2000.0)
    used, total = drill_causes.still_device(env)  # type: ignore[arg-type]
    assert used in (1149.0, 1150.0, 1151.0) and total == 2000.0  # after the drop


def test_memory_that_never_holds_still_gives_its_last_reading(
    quick_ramp: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(drill_causes, "RAMP_STILL_WITHIN_S", 0.3)
    env = _MemoryEnv([1000.0, 1200.0] * 1000, total=2000.0)
    used, _ = drill_causes.still_device(env)  # type: ignore[arg-type]
    assert used in (1000.0, 1200.0)
    assert "still moving; the ramp starts from" in capsys.readouterr().out
