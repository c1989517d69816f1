"""Causes of the drills that take more than one fault request.

Each is real: memory is allocated and touched inside the worker's memory
cgroup, whose limit the kernel enforces and the agent reads as the device's
size; the OOM is the kernel's OOM killer acting on that cgroup (its
``oom_kill`` count is the agent's evidence); the Redis tier is slowed by a
proxy on its TCP connection; a start is delayed before the model loads.
Amounts are computed from what the agent sees when the drill starts, so the
drills work whatever the model's size.
"""

from __future__ import annotations

import click
import httpx

from kcops.cli.demo_env import DEMO_STARTUP_TIMEOUT_S, DemoEnv, DemoFailed, wait

MEMORY_HIGH_TARGET = 0.94  # of the device: over the alert's 0.9, under the kernel's limit
RAMP_TOP = 0.85  # the forecast drill's ramp stops short of KcopsDeviceMemoryHigh's 0.9
RAMP_SECONDS = 240  # reaching RAMP_TOP in 4 min: the 10m trend then says "full in 15m"
SEGMENT_DELAY_S = 0.08  # added to each Redis request: over the 50 ms p99 threshold
TOKEN_DELAY_MS = 6000  # added to each decode step: over the demo's 5 s p99 threshold
START_DELAY_S = DEMO_STARTUP_TIMEOUT_S + 30


def needs_cgroup(env: DemoEnv) -> str | None:
    if env.cgroup is None:
        return f"a writable memory cgroup for the worker ({env.no_cgroup_reason})"
    return None


def needs_redis(env: DemoEnv) -> str | None:
    return None if env.redis_proxy is not None else "redis-server (the KV cache's Redis tier)"


def device_memory(env: DemoEnv) -> tuple[float, float]:
    """(used, total) bytes of the worker's device as the agent sees them.

    Waits (the agent re-reads a limit every 10 s) until its total is the cgroup's limit.
    """
    limit = env.cgroup.limit_bytes() if env.cgroup is not None else None

    def seen() -> tuple[float, float] | None:
        used = env.query('max(kcops_device_memory_used_bytes{device="cpu"})')
        total = env.query('max(kcops_device_memory_total_bytes{device="cpu"})')
        if used is None or total is None or (limit is not None and int(total) != limit):
            return None
        return used, total

    got: tuple[float, float] = wait("the agent seeing the worker's memory limit", 60, seen)
    return got


def fill_device(env: DemoEnv) -> None:
    used, total = device_memory(env)
    n = int(MEMORY_HIGH_TARGET * total - used)
    if n <= 0:
        raise DemoFailed(f"device already at {used / total:.0%} before the drill")
    click.echo(f"  holding {n / 2**20:.0f} MiB: {used / total:.0%} -> {MEMORY_HIGH_TARGET:.0%}")
    env.fault({"hold_memory_bytes": n})


def ramp_device(env: DemoEnv) -> None:
    used, total = device_memory(env)
    cap = int(RAMP_TOP * total - used)
    if cap <= 0:
        raise DemoFailed(f"device already at {used / total:.0%} before the drill")
    rate = cap // RAMP_SECONDS
    click.echo(
        f"  memory ramp {rate / 2**20:.1f} MiB/s for {RAMP_SECONDS}s: "
        f"{used / total:.0%} -> {RAMP_TOP:.0%} of the device"
    )
    env.fault({"memory_ramp_bytes_per_s": rate, "memory_ramp_to_bytes": cap})


def stop_ramp(env: DemoEnv) -> None:
    env.fault({"memory_ramp_bytes_per_s": 0})


def clear_faults(env: DemoEnv) -> None:
    env.fault({"clear": True})


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


def wait_new_worker(env: DemoEnv) -> None:
    """After a restart, the new worker answering (at once when the old one still serves)."""
    first = env.first_pid
    try:
        if env.worker_state()["pid"] == first and env.fault_state().get("hang") is False:
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


def engine_ready(env: DemoEnv) -> None:
    """Wait until the agent itself sees the engine ready (it refuses to act on a starting one)."""
    ready = 'max(kcops_engine_state{state="ready"})'
    wait("the agent seeing the worker ready", 300, lambda: env.query(ready) == 1.0)


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


def end_token_delay(env: DemoEnv) -> None:
    env.fault({"token_delay_ms": 0})
    env.set_load_mode("mixed")


def slow_redis(env: DemoEnv) -> None:
    assert env.redis_proxy is not None
    env.redis_proxy.delay_s = SEGMENT_DELAY_S


def fast_redis(env: DemoEnv) -> None:
    assert env.redis_proxy is not None
    click.echo(f"  Redis requests delayed: {env.redis_proxy.bursts_delayed}")
    env.redis_proxy.delay_s = 0.0
    env.set_load_mode("mixed")
