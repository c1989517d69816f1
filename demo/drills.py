"""The demo's drills: each alert of the table reproduced on the reference worker by a real cause.

A drill applies its cause (a worker fault, a shift of the Locust traffic, a
lower attention budget), waits for the alert to fire and for the agent's
ladder to act, then removes the cause. Resolution is awaited for all drills
together at the end (:func:`settle`), because an alert's windows keep it
active a while after its cause is gone. A drill whose cause needs something
this machine lacks (a writable memory cgroup, redis-server) says which and is
reported as not run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

import click

from kcops.cli.timefmt import duration
from kcops.demo import causes as c
from kcops.demo.env import DEMO_COOLDOWN_S, DemoEnv, DemoFailed, wait

Step = Callable[[DemoEnv], None]


@dataclass(frozen=True)
class Drill:
    alert: str
    cause: str
    start: Step
    stop: Step
    fire_within_s: float
    estimate_s: float  # start to the next drill, on this kind of machine
    default: bool = False
    needs: str | None = None  # a feature missing for a real cause: the drill is not run
    # What this machine must offer (a writable memory cgroup, Redis): None, or why not.
    precheck: Callable[[DemoEnv], str | None] | None = None
    # Set up before the alert must be seen inactive (e.g. a load that keeps it quiet).
    prepare: Step | None = None
    # Where the ladder's action itself must remove the cause (evicting frees the
    # memory that filled the device): true once it has, awaited before ``stop``.
    relief: Callable[[DemoEnv], bool] | None = None
    # Seconds of the demo's usual load wanted before the cause: a rule that compares
    # with a baseline window would otherwise compare the cause with itself.
    history_s: float = 0.0
    # Seconds its alert may stay active once the cause is gone: a rule that compares
    # with a baseline window sees the cause in the baseline until the window passes it
    # (|1m / 10m - 1| then reads the recovery as a fluctuation the other way).
    settle_s: float = 0.0


@dataclass
class DrillResult:
    alert: str
    fired: bool = False
    time_to_fire_s: float | None = None
    action: str | None = None
    resolved: bool = False
    note: str = ""
    relieved: bool | None = None  # for drills with a ``relief``: did the action do it
    settle_by: float | None = None  # wall clock by which its alert should be inactive

    @property
    def ok(self) -> bool:
        return self.fired and bool(self.action) and self.resolved and self.relieved is not False


# Rule params the demo's agent runs with: the table's alerts as shipped, with
# windows short enough that an alert resolves within minutes of its cause going,
# and latency thresholds scaled to this kind of machine (a shared 2-core CPU
# serves SmolLM2's first token in about a second and decodes a token in about
# 0.3 s under the demo's load, where the shipped 0.5 s and 250 ms are for GPUs).
DEMO_PARAMS = {
    "attention_errors_window": "1m",
    "rate_window": "1m",
    "baseline_window": "10m",
    "p99_ttft_seconds": 8,
    "p99_inter_token_seconds": 2.5,
}
# The demo's copy of the rules caps every ``for`` and ``keep_firing_for`` (the
# shipped 5m, 10m and 30m would make the fourteen drills take hours).
DEMO_MAX_FOR = "2m"
DEMO_MAX_KEEP_FIRING_FOR = "1m"
# the demo's 10m baseline window, its 1m keep_firing_for, and margin
BASELINE_SETTLE_S = 600 + 60 + 90
QUIET_WITHIN_S = 240  # an alert's 1m rate window plus its keep_firing_for, and margin
COOLDOWNS_WITHIN_S = DEMO_COOLDOWN_S + 30  # the demo's guard cooldown, and margin
RELIEF_WITHIN_S = 300  # a ladder's first steps and their verify windows

DRILLS: tuple[Drill, ...] = (
    Drill(
        "KcopsAttentionErrors", "NaN injected into the attention output",
        lambda e: e.fault({"nan": True}), lambda e: e.fault({"nan": False}),
        fire_within_s=60, estimate_s=30, default=True,
    ),
    # First of the slow drills: its baseline is the mean latency of the last 10m,
    # which every later disturbance (and its recovery) moves.
    Drill(
        "KcopsLatencyFluctuation",
        "every request delayed 1.5x the mean latency (>= 3 s): mean latency off its baseline",
        c.fluctuate, lambda e: e.fault({"latency_ms": 0}),
        # 10 min of the usual load first: the rule counts only once the engine has been
        # ready for its whole (demo: 10m) baseline window, and with a short history the
        # baseline is the 1m mean itself and the two rise together
        fire_within_s=420, estimate_s=420, history_s=600, settle_s=BASELINE_SETTLE_S,
    ),
    Drill(
        "KcopsP99LatencyHigh",
        f"overload: {c.OVERLOAD_USERS} more Locust users; requests queue behind each prefill",
        c.overload, c.end_overload, fire_within_s=420, estimate_s=200,
    ),
    Drill(
        "KcopsInterTokenLatencyHigh", "every decode step delayed 3 s in the worker's model loop",
        lambda e: e.fault({"token_delay_ms": c.TOKEN_DELAY_MS}), c.end_token_delay,
        fire_within_s=300, estimate_s=200,
        # Short prompts only: a long prompt's prefill stalls the other streams'
        # decoding (no chunked prefill), which is inter-token latency too, but
        # not this drill's cause.
        prepare=lambda e: e.set_load_mode("short"),
    ),
    Drill(
        "KcopsPrefixCacheHitRateLow", "traffic with no prefix reuse (every prompt starts apart)",
        lambda e: e.set_load_mode("unique"), lambda e: e.set_load_mode("mixed"),
        fire_within_s=420, estimate_s=180,
    ),
    # Before the K(C) surge: its long prompts lower shadow agreement too, and the
    # agreement gauge (the last 32 checks) takes minutes of mixed traffic to recover.
    Drill(
        "KcopsAccuracyDrop", "attention budget N lowered to 2 keys: shadow agreement falls",
        lambda e: e.admin("/admin/attention", {"top_n": c.LOW_TOP_N}), c.restore_budget,
        fire_within_s=600, estimate_s=300, history_s=240,
    ),
    Drill(
        "KcopsKCSurge",
        "traffic shifts to prompts 4x longer: more context holds the attention mass",
        lambda e: e.set_load_mode("long"), lambda e: e.set_load_mode("mixed"),
        fire_within_s=420, estimate_s=240, history_s=300,
    ),
    Drill(
        "KcopsSegmentTransferSlow",
        "150 ms added to each request burst on the worker's Redis connection",
        c.slow_redis, c.fast_redis, fire_within_s=420, estimate_s=240,
        precheck=lambda e: None if e.redis_proxy else "redis-server (the KV cache's Redis tier)",
        # One long prompt for every user, with a memory tier smaller than its KV:
        # its segments come back from Redis on every request (transfers to measure).
        prepare=c.hot_from_redis,
    ),
    Drill(
        "KcopsDeviceMemoryFullSoon", "the worker's memory climbs steadily to 80% of its limit",
        c.ramp_device, lambda e: e.fault({"memory_ramp_bytes_per_s": 0}),
        fire_within_s=720, estimate_s=480,
        precheck=c.needs_cgroup,
    ),
    Drill(
        "KcopsDeviceMemoryHigh",
        "the KV cache's budget raised past the device; long prompts with no reuse fill it",
        c.fill_cache, c.restore_cache, fire_within_s=240, estimate_s=360,
        precheck=c.needs_cgroup, relief=c.device_below_threshold,
    ),
    Drill(
        "KcopsEngineDown", "the worker's loop hangs (health stops answering)",
        lambda e: e.fault({"hang": True}), c.end_hang,
        fire_within_s=120, estimate_s=90, default=True,
    ),
    Drill(
        "KcopsEngineStalled",
        "the worker's model loop stops while /health and /metrics answer; requests pend",
        lambda e: e.fault({"stall": True}), c.end_stall,
        fire_within_s=120, estimate_s=90,
    ),
    Drill(
        "KcopsEngineOOM", "the worker allocates past its cgroup limit: the kernel OOM-kills it",
        c.out_of_memory, c.wait_new_worker, fire_within_s=120, estimate_s=120,
        precheck=c.needs_cgroup,
    ),
    Drill(
        "KcopsEngineRestarting",
        "on-call restarts the worker through the agent: the restart's own alerts are inhibited",
        c.restart_by_hand, c.wait_new_worker, fire_within_s=60, estimate_s=90,
    ),
    Drill(
        "KcopsEngineStartSlow", "the worker restarted with its model load held back 150 s",
        c.slow_start, c.end_slow_start, fire_within_s=300, estimate_s=240,
    ),
    Drill(
        "KcopsBudgetMismatch",
        f"attention budget N raised to {c.OVER_BUDGET_MARGIN:g}x the rule's ratio x the live "
        "K(C) recommendation: KV memory held for keys nobody attends",
        c.over_budget, c.restore_budget,
        # its `for` (2m here) and the 30 s recommendation schedule, and margin
        fire_within_s=300, estimate_s=240,
        # A recommendation first: the demo's 10m window filling to min_samples a layer.
        prepare=c.await_recommendation,
    ),
)  # fmt: skip


def select(spec: str) -> list[Drill]:
    """``default``, ``all``, ``none`` or a comma list of alert names."""
    spec = spec.strip()
    if spec == "none":
        return []
    if spec == "default":
        return [d for d in DRILLS if d.default]
    if spec == "all":
        return list(DRILLS)
    names = [n.strip() for n in spec.split(",") if n.strip()]
    by_name = {d.alert: d for d in DRILLS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise click.BadParameter(
            f"unknown drill(s) {unknown}: use default, all, none or names from "
            f"{', '.join(by_name)}",
            param_hint="--drills",
        )
    return [by_name[n] for n in names]


def estimate_s(drills: list[Drill]) -> float:
    return sum(d.estimate_s for d in drills if d.needs is None)


def actions_text(names: list[str]) -> str | None:
    """``evict_cache x2``, ``raise_topn, fallback_to_base``; None for no action."""
    runs = [(n, len(list(same))) for n, same in itertools.groupby(names)]
    return ", ".join(n if k == 1 else f"{n} x{k}" for n, k in runs) or None


def ladder_action(env: DemoEnv, alert: str, since: float) -> str | None:
    """The actions the alert's ladder ran (outcome ok) since ``since``, in order."""
    runs = env.audit_runs(since)
    return actions_text(
        [str(r.get("action")) for r in runs if (r.get("ladder") or {}).get("alertname") == alert]
    )


def run_drill(env: DemoEnv, drill: Drill) -> DrillResult:
    res = DrillResult(drill.alert)
    needs = drill.needs or (drill.precheck(env) if drill.precheck is not None else None)
    if needs is not None:
        res.note = f"not run: needs {needs}"
        click.echo(f"- drill {drill.alert}: {res.note}")
        return res
    click.echo(f"- drill {drill.alert}: {drill.cause}")
    try:
        _await_history(env, drill)
        if drill.prepare is not None:
            drill.prepare(env)
        # A drill shows its cause firing the alert: an alert already active (a
        # baseline over its threshold here, or an earlier drill) would prove nothing.
        quiet = f"{drill.alert} inactive before its cause"
        try:
            wait(quiet, QUIET_WITHIN_S, lambda: env.alert_state(drill.alert) == "inactive")
        except DemoFailed:
            raise DemoFailed(f"not drilled: {drill.alert} was active before its cause") from None
        # Its ladder must be free to act: a cooldown the drill before set on the same
        # target (two restarts 21 s apart: the second's notify skipped) would fail it.
        # A longer cooldown (an action's own) is said, and the drill goes on.
        try:
            free = "the agent's cooldowns running out"
            wait(free, COOLDOWNS_WITHIN_S, lambda: not env.cooldowns_left())
        except DemoFailed:
            left = f"after {COOLDOWNS_WITHIN_S:.0f}s"
            click.echo(f"  cooldowns still running {left}; the drill goes on")
        t0 = time.time()
        drill.start(env)
        # Its ladder acting proves it fired: a restart without a drain (a hung or stalled
        # engine) resolves the alert within a second, between two looks at its state.
        wait(
            f"{drill.alert} firing",
            drill.fire_within_s,
            lambda: env.alert_state(drill.alert) == "firing" or ladder_action(env, drill.alert, t0),
        )
        res.fired, res.time_to_fire_s = True, time.time() - t0
        res.action = wait(
            "the agent's ladder acting", 180, lambda: ladder_action(env, drill.alert, t0)
        )
        click.echo(f"  action: {res.action}; route mode now: {env.route_mode()}")
        if drill.relief is not None:
            _await_relief(env, drill, res, t0)
    except DemoFailed as exc:
        res.note = str(exc)
        click.echo(f"  {exc}")
    finally:
        drill.stop(env)
        if drill.settle_s:
            res.settle_by = time.time() + drill.settle_s
    return res


def _await_history(env: DemoEnv, drill: Drill) -> None:
    """Let the usual load run until the alert's baseline window holds ``history_s`` of it."""
    if env.load_since is None:
        return
    left = env.load_since + drill.history_s - time.time()
    if left > 0:
        click.echo(
            f"  {drill.alert} compares with a baseline: {duration(left)} more of the usual "
            f"load first ({duration(drill.history_s)} of it before the cause)"
        )
        time.sleep(left)


def _await_relief(env: DemoEnv, drill: Drill, res: DrillResult, t0: float) -> None:
    """The cause still applied, wait for the ladder's actions themselves to remove it."""
    relief = drill.relief
    assert relief is not None
    try:
        wait("the ladder's action relieving the cause", RELIEF_WITHIN_S, lambda: relief(env))
        res.relieved = True
    except DemoFailed:
        res.relieved = False
        res.note = "the ladder's actions did not relieve the cause"
    res.action = ladder_action(env, drill.alert, t0) or res.action
    click.echo(f"  ladder actions: {res.action}")


def settle(env: DemoEnv, results: list[DrillResult], timeout_s: float) -> None:
    """Wait (one deadline for all) until every drilled alert is inactive again."""
    pending = [r for r in results if r.fired]
    if not pending:
        return
    # A baseline rule's alert stays active until its window has passed the cause.
    timeout_s = max([timeout_s] + [r.settle_by - time.time() for r in pending if r.settle_by])

    def all_resolved() -> bool:
        for r in pending:
            r.resolved = r.resolved or env.alert_state(r.alert) == "inactive"
        return all(r.resolved for r in pending)

    try:
        wait("drilled alerts resolving", timeout_s, all_resolved, every_s=2)
    except DemoFailed as exc:
        click.echo(f"  {exc}")


def table(results: list[DrillResult]) -> list[str]:
    lines = [f"{'alert':<27} {'fired':<5} {'to fire':>7}  {'action taken':<17} resolved"]
    for r in results:
        ttf = duration(r.time_to_fire_s) if r.time_to_fire_s is not None else "-"
        lines.append(
            f"{r.alert:<27} {'yes' if r.fired else 'no':<5} {ttf:>7}  {r.action or '-':<17} "
            f"{'yes' if r.resolved else 'no'}" + (f"  ({r.note})" if r.note else "")
        )
    return lines
