"""Causes of the drills that take more than one fault request.

Each is real: the KV cache fills with real blocks of real prompts, and memory
is allocated and touched inside the worker's memory cgroup, whose limit the
kernel enforces and the agent reads as the device's size; an overload is more
Locust users; the OOM is the kernel's OOM killer acting on that cgroup (its
``oom_kill`` count is the agent's evidence); the Redis tier is slowed by a
proxy on its TCP connection; a start is delayed before the model loads.
Amounts are computed from what the agent sees when the drill starts, so the
drills work whatever the model's size.
"""

from __future__ import annotations

import math
import time

import click
import httpx

from kcops.demo.env import (
    DEMO_STARTUP_TIMEOUT_S,
    DEMO_TOP_N,
    DEMO_TOPN_MAX,
    DemoEnv,
    DemoFailed,
    wait,
)

DEVICE_MEMORY_RATIO = 0.9  # KcopsDeviceMemoryHigh's shipped threshold, which the demo keeps
DEVICE_USED = 'max(kcops_device_memory_used_bytes{device="cpu"})'  # as the agent sees it

MEMORY_HIGH_TARGET = 0.91  # of the device, the cache alone: over the alert's 0.9
FILL_TARGET = 0.93  # while filling (prefills' activations included): under the kernel's limit
FILL_STEP = 0.7  # each raise of the cache budget covers this share of what is left to fill
FILL_ROUNDS = 4
SETTLE_S = 8.0
RAMP_TOP = 0.80  # the forecast drill's ramp stops well short of KcopsDeviceMemoryHigh's 0.9:
# the worker's own memory grows some points more under the load meanwhile (0.85 reached
# 0.89-0.90, and each second over 0.9 reset the forecast alert's `for` through its `unless`)
RAMP_SECONDS = 240  # reaching RAMP_TOP in 4 min: the 10m trend then says "full in 15m"
# The ramp starts from memory that holds still (within RAMP_STILL of the device for
# RAMP_STILL_S): the drill before may have just given back a cache tier, which frees
# memory over some seconds. Measured from before such a drop (65%, then 57% as the ramp
# began), the ramp stopped at 72% and the 10m trend never said "full" in 12 min.
RAMP_STILL, RAMP_STILL_S, RAMP_STILL_WITHIN_S, RAMP_POLL_S = 0.02, 30.0, 180.0, 2.0
SEGMENT_DELAY_S = 0.15  # added to each Redis request burst: over the 50 ms p99 threshold
HOT_TIER_BYTES = 8 * 1024**2  # the memory tier while the segment drill runs: < the hot KV
TOKEN_DELAY_MS = 3000  # added to each decode step: over the demo's 2.5 s p99 threshold
FLUCTUATION_MS = 3000  # added to each request, at least: more than a quiet demo's mean latency
FLUCTUATION_OF_MEAN = 1.5  # ... and 1.5x the mean latency the agent sees when the drill starts
OVERLOAD_USERS = 36  # Locust users added: requests queue behind prefills even when idle
LOW_TOP_N = 2  # keys kept per head: far below what the traffic needs
START_DELAY_S = DEMO_STARTUP_TIMEOUT_S + 30
# The budget-mismatch drill sets N this far past the rule's budget_over_ratio x the live
# recommendation: clear of the line while the recommendation moves a bucket up.
OVER_BUDGET_MARGIN = 2.0
RECOMMENDATION_WITHIN_S = 600  # the demo's window filling to min_samples a layer, and margin
RECOMMENDED_N = "max(kcops_kc_recommended_n)"
INCIDENT_WITHIN_S = 30.0  # the record is written before the restart: listed at once, in margin


def needs_cgroup(env: DemoEnv) -> str | None:
    if env.cgroup is None:
        return f"a writable memory cgroup for the worker ({env.no_cgroup_reason})"
    return None


def device_memory(env: DemoEnv) -> tuple[float, float]:
    """(used, total) bytes of the worker's device as the agent sees them.

    Waits (the agent re-reads a limit every 10 s) until its total is the cgroup's limit.
    """
    limit = env.cgroup.limit_bytes() if env.cgroup is not None else None

    def seen() -> tuple[float, float] | None:
        used = env.query(DEVICE_USED)
        total = env.query('max(kcops_device_memory_total_bytes{device="cpu"})')
        if used is None or total is None or (limit is not None and int(total) != limit):
            return None
        return used, total

    return wait("the agent seeing the worker's memory limit", 60, seen)


def fill_cache(env: DemoEnv) -> None:
    """Raise the KV cache's budget past the device and fill it with new prefixes.

    The budget grows in steps as the device fills (a block costs the process more
    than its tensors' bytes), so memory stops near FILL_TARGET, short of the
    kernel's limit. The filling traffic then stops: the cache stays full (nothing
    but an eviction shrinks it) on short prompts that add next to nothing. A
    prefill's own activations are part of what the device showed while filling:
    once they are gone, a device under MEMORY_HIGH_TARGET is filled again.
    """
    used, total = device_memory(env)
    if used >= MEMORY_HIGH_TARGET * total:
        raise DemoFailed(f"device already at {used / total:.0%} before the drill")
    cached = env.worker_state()["cache"]["bytes"]
    budget = int(cached + FILL_STEP * (FILL_TARGET * total - used))
    env.fault({"cache_budget_bytes": budget})
    click.echo(
        f"  KV cache budget {budget / 2**20:.0f} MiB, long prompts with no reuse: "
        f"device {used / total:.0%} -> {MEMORY_HIGH_TARGET:.0%}"
    )

    def filled() -> bool:
        nonlocal budget
        ratio = _device_ratio(env)
        if ratio is not None and ratio >= FILL_TARGET:
            return True
        cache = env.worker_state()["cache"]
        if ratio is not None and cache["usage_ratio"] >= 0.97:
            budget = int(cache["bytes"] + FILL_STEP * (FILL_TARGET - ratio) * total)
            env.fault({"cache_budget_bytes": budget})
        return False

    for _ in range(FILL_ROUNDS):
        env.set_load_mode("unique-long")
        try:
            wait("the KV cache filling the device", 600, filled, every_s=2)
        finally:
            env.set_load_mode("short")
        ratio = _settled_ratio(env)
        if ratio >= MEMORY_HIGH_TARGET:
            break
        click.echo(f"  device {ratio:.0%} once the prefills were done: filling on")
    cache = env.worker_state()["cache"]
    click.echo(f"  KV cache {cache['blocks']} blocks, {cache['bytes'] / 2**20:.0f} MiB")


def _settled_ratio(env: DemoEnv) -> float:
    """The device's ratio once the last long prefill is done and the agent has read it."""
    wait("the filling requests finishing", 120, lambda: env.worker_state()["in_flight"] <= 1)
    deadline = time.monotonic() + SETTLE_S  # the agent samples memory every tick (1 s)
    ratio = None
    while time.monotonic() < deadline or ratio is None:
        ratio = _device_ratio(env)
        time.sleep(1.0)
    return ratio


def _device_ratio(env: DemoEnv) -> float | None:
    return env.query(
        'max(kcops_device_memory_used_bytes{device="cpu"} '
        '/ kcops_device_memory_total_bytes{device="cpu"})'
    )


def device_below_threshold(env: DemoEnv) -> bool:
    """The device back under KcopsDeviceMemoryHigh's threshold (the cache's budget still high)."""
    ratio = _device_ratio(env)
    return ratio is not None and ratio < DEVICE_MEMORY_RATIO


def restore_cache(env: DemoEnv) -> None:
    env.fault({"cache_budget_bytes": 0})  # the configured budget: blocks past it dropped
    env.set_load_mode("mixed")


def still_device(env: DemoEnv) -> tuple[float, float]:
    """(used, total) once the worker's memory has held still for RAMP_STILL_S; after
    RAMP_STILL_WITHIN_S, the last reading, and the demo says so."""
    _, total = device_memory(env)
    seen: list[tuple[float, float]] = []

    def still() -> float | None:
        used = env.query(DEVICE_USED)
        if used is None:
            return None
        now = time.monotonic()
        seen.append((now, used))
        recent = [u for t, u in seen if t >= now - RAMP_STILL_S]
        if seen[0][0] > now - RAMP_STILL_S or max(recent) - min(recent) > RAMP_STILL * total:
            return None
        return used

    try:
        return wait(
            "the worker's memory holding still", RAMP_STILL_WITHIN_S, still, RAMP_POLL_S
        ), total
    except DemoFailed:
        if not seen:
            raise
        used = seen[-1][1]
        click.echo(f"  the worker's memory still moving; the ramp starts from {used / total:.0%}")
        return used, total


def ramp_device(env: DemoEnv) -> None:
    used, total = still_device(env)
    cap = int(RAMP_TOP * total - used)
    if cap <= 0:
        raise DemoFailed(f"device already at {used / total:.0%} before the drill")
    rate = cap // RAMP_SECONDS
    click.echo(
        f"  memory ramp {rate / 2**20:.1f} MiB/s for {RAMP_SECONDS}s: "
        f"{used / total:.0%} -> {RAMP_TOP:.0%} of the device"
    )
    env.fault({"memory_ramp_bytes_per_s": rate, "memory_ramp_to_bytes": cap})


def out_of_memory(env: DemoEnv) -> None:
    """Allocate past the cgroup limit: the kernel's OOM killer ends the worker."""
    cg = env.cgroup
    assert cg is not None
    before = cg.oom_kills()
    _, total = device_memory(env)
    try:
        env.fault({"hold_memory_bytes": int(total)})
    except httpx.HTTPError:
        pass  # the worker died while answering: expected
    else:
        raise DemoFailed("the worker held more than its cgroup limit and was not killed")
    wait("the kernel OOM-killing the worker", 60, lambda: cg.oom_kills() > before)
    click.echo(f"  cgroup oom_kill {before} -> {cg.oom_kills()}")


def end_stall(env: DemoEnv) -> None:
    """After the stall drill: the respawned worker answering; a worker still the same
    (nothing restarted it) has its stall cleared instead."""
    try:
        if env.worker_state()["pid"] == env.first_pid:
            if env.worker_state()["faults"].get("stall"):
                env.fault({"stall": False})
            return
    except httpx.HTTPError:
        pass
    wait_new_worker(env)


def wait_new_worker(env: DemoEnv) -> None:
    """After a restart, the new worker answering (at once when the old one still serves)."""
    first = env.first_pid
    try:
        if env.worker_state()["pid"] == first and env.worker_state()["faults"].get("hang") is False:
            return  # nothing was restarted (the cause did not take)
    except httpx.HTTPError:
        pass
    new = wait(
        "a new worker process answering",
        600,
        lambda: (p := env.worker_state()["pid"]) != first and p,
    )
    click.echo(f"  worker pid {first} -> {new}")
    env.first_pid = new


def end_hang(env: DemoEnv) -> None:
    """After the hang drill: the new worker answering, then what the agent kept of the hang."""
    wait_new_worker(env)
    show_incident(env, "KcopsEngineDown")


def show_incident(env: DemoEnv, alertname: str) -> None:
    """Print the summary of the newest incident that ``alertname`` opened or joined (as
    ``kcops incident show`` does), or say loudly that none was recorded: the drill's own
    verdict stays the alert and its action."""
    from kcops.cli.incident import fetch_list, fetch_record, summary
    from kcops.errors import KcopsError

    def found() -> str | None:
        for rec in fetch_list(env.agent, env.headers):
            names = {rec.get("trigger")} | {a.get("alertname") for a in rec.get("alerts") or []}
            if alertname in names:
                return str(rec["id"])
        return None

    try:
        incident_id = wait(f"an incident for {alertname}", INCIDENT_WITHIN_S, found, every_s=1)
        text = summary(fetch_record(env.agent, incident_id, env.headers))
    except (DemoFailed, KcopsError) as exc:
        click.echo(f"  NO INCIDENT RECORD for {alertname}: {exc}")
        return
    click.echo(f"  the incident the agent recorded (kcops incident show {incident_id}):")
    for line in text.splitlines():
        click.echo("    " + line)


def engine_ready(env: DemoEnv) -> None:
    """Wait until the agent itself sees the engine ready (it refuses to act on a starting one)."""
    ready = 'max(kcops_engine_state{state="ready"})'
    wait("the agent seeing the worker ready", 300, lambda: env.query(ready) == 1.0)


def restart_by_hand(env: DemoEnv) -> None:
    """Restart the worker through the agent's API, as on-call would."""
    engine_ready(env)
    rec = env.run_action("restart_worker")
    click.echo(f"  restart_worker: {rec.get('detail') or rec.get('outcome')}")


def slow_start(env: DemoEnv) -> None:
    """Restart the worker (as on-call would) with its model load held back."""
    engine_ready(env)
    env.start_delay_file.write_text(f"{START_DELAY_S:g}\n")
    rec = env.run_action("restart_worker")
    click.echo(
        f"  restart_worker: {rec.get('detail') or rec.get('outcome')}; the new worker waits "
        f"{START_DELAY_S:g}s before loading (startup timeout {DEMO_STARTUP_TIMEOUT_S:g}s)"
    )


def end_slow_start(env: DemoEnv) -> None:
    env.start_delay_file.write_text("")  # the next start is normal again
    wait_new_worker(env)


MEAN_LATENCY = (
    "sum(rate(kcops_request_latency_seconds_sum[10m]))"
    " / sum(rate(kcops_request_latency_seconds_count[10m]))"
)


def fluctuation_ms(mean_latency_s: float | None) -> int:
    """The delay that moves the mean latency off its baseline whatever the baseline is.

    A fixed 3 s did not fire on a loaded machine: with a 15 s mean, +3 s is +20% at
    most, and the 10m baseline soon takes the delay in too. 1.5x the mean keeps the
    1m mean over the 10m baseline's 1.2x until the baseline is two thirds delayed."""
    if mean_latency_s is None or not mean_latency_s > 0:
        return FLUCTUATION_MS
    from kcops.worker.faults import MAX_LATENCY_MS

    wanted = int(1000 * FLUCTUATION_OF_MEAN * mean_latency_s)
    return int(min(MAX_LATENCY_MS, max(FLUCTUATION_MS, wanted)))


def fluctuate(env: DemoEnv) -> None:
    delay = fluctuation_ms(env.query(MEAN_LATENCY))
    click.echo(f"  every request delayed {delay / 1000:.1f} s (the mean latency's 1.5x, >= 3 s)")
    env.fault({"latency_ms": delay})


def overload(env: DemoEnv) -> None:
    env.overload = env.start_locust("overload", OVERLOAD_USERS)


def end_overload(env: DemoEnv) -> None:
    if env.overload is not None:
        env.overload.stop()
        env.overload = None


def restore_budget(env: DemoEnv) -> None:
    """N back to the worker's configured budget (the ladder raised it by steps from 2)."""
    env.admin("/admin/attention", {"top_n": DEMO_TOP_N})
    click.echo(f"  attention budget N back to {DEMO_TOP_N}")


def end_token_delay(env: DemoEnv) -> None:
    env.fault({"token_delay_ms": 0})
    env.set_load_mode("mixed")


def hot_from_redis(env: DemoEnv) -> None:
    """Everyone asks about one long document whose KV is larger than the memory tier."""
    env.fault({"cache_budget_bytes": HOT_TIER_BYTES})
    env.set_load_mode("hot")


def slow_redis(env: DemoEnv) -> None:
    assert env.redis_proxy is not None
    env.redis_proxy.delay_s = SEGMENT_DELAY_S


def fast_redis(env: DemoEnv) -> None:
    assert env.redis_proxy is not None
    click.echo(f"  Redis requests delayed: {env.redis_proxy.bursts_delayed}")
    env.redis_proxy.delay_s = 0.0
    env.fault({"cache_budget_bytes": 0})
    env.set_load_mode("mixed")


def budget_over_ratio(env: DemoEnv) -> float:
    """KcopsBudgetMismatch's ``budget_over_ratio``: the demo's param, else the shipped one."""
    if "budget_over_ratio" in env.rule_params:
        return float(env.rule_params["budget_over_ratio"])  # type: ignore[arg-type]
    from kcops.agent.rules.loader import default_rules_path
    from kcops.agent.yamlload import load_yaml_file

    return float(load_yaml_file(default_rules_path())["params"]["budget_over_ratio"])


def recommended_n(env: DemoEnv) -> float:
    """The agent's live K(C) recommendation (kcops_kc_recommended_n), once it has one."""
    return wait(
        "the agent's live K(C) recommendation (kcops_kc_recommended_n; its window "
        "filling to recommendation.min_samples a layer)",
        RECOMMENDATION_WITHIN_S,
        lambda: env.query(RECOMMENDED_N),
        every_s=2,
    )


def await_recommendation(env: DemoEnv) -> None:
    n = recommended_n(env)
    click.echo(f"  live recommendation N = {n:.0f}; the worker's N = {DEMO_TOP_N}")


def over_budget(env: DemoEnv) -> None:
    """N far above the live recommendation: KV held for keys nobody attends."""
    rec = env.query(RECOMMENDED_N) or recommended_n(env)  # the prepare step waited for it
    ratio = budget_over_ratio(env)
    n = math.ceil(OVER_BUDGET_MARGIN * ratio * rec)
    if n > DEMO_TOPN_MAX:
        raise DemoFailed(
            f"N {n} ({OVER_BUDGET_MARGIN:g} x {ratio:g} x the recommended {rec:.0f}) is over "
            f"the worker's --topn-max {DEMO_TOPN_MAX}"
        )
    env.admin("/admin/attention", {"top_n": n})
    click.echo(
        f"  attention budget N {DEMO_TOP_N} -> {n}: {n / rec:.1f}x the live recommendation "
        f"{rec:.0f} (the rule: over {ratio:g}x)"
    )
