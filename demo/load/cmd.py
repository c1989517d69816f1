"""``kcops load``: Locust headless against an OpenAI-compatible engine, with a ramp."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import click

from kcops.cli.common import FiniteFloat, echo_json, handle_errors
from kcops.demo.load.run import AlertWatch, LocustRun, as_json, summary_lines


@click.command(
    "load",
    help="Real load with Locust (streaming completions, short and long prompts); "
    "prints p99 latency, TTFT p99 and error rate from Locust's stats, and the agent's alerts.",
)
@click.option("--host", required=True, help="Engine base URL (OpenAI-compatible).")
@click.option("--agent", "agent_url", envvar="KCOPS_AGENT", help="Agent to watch for alerts.")
@click.option("--users", default=8, show_default=True, type=click.IntRange(1, 10_000))
@click.option(
    "--spawn-rate", default=1.0, show_default=True, type=FiniteFloat(0.01, 1000),
    help="Users started per second: the ramp.",
)  # fmt: skip
@click.option(
    "--run-time", "run_time_s", default=60.0, show_default=True, type=FiniteFloat(1, 86400)
)
@click.option("--max-tokens", default=16, show_default=True, type=click.IntRange(1, 4096))
@click.option("--out", type=click.Path(file_okay=False), help="Keep Locust's CSV and log here.")
@click.option("--json", "as_json_out", is_flag=True, help="Print the result as JSON.")
@handle_errors
def load_cmd(
    host: str,
    agent_url: str | None,
    users: int,
    spawn_rate: float,
    run_time_s: float,
    max_tokens: int,
    out: str | None,
    as_json_out: bool,
) -> None:
    folder = Path(out or tempfile.mkdtemp(prefix="kcops-load-"))
    run = LocustRun(
        host, folder / "locust", users, spawn_rate, run_time_s, max_tokens, folder / "locust.log"
    )
    watch = AlertWatch(agent_url) if agent_url else None
    if not as_json_out:
        click.echo(
            f"locust: {users} users, +{spawn_rate}/s, {run_time_s:.0f}s against {host}"
            f" (logs in {folder})"
        )
    t0 = time.time()
    run.start()
    if watch:
        watch.start()
    try:
        run.wait(run_time_s + 60)
    finally:
        run.stop()
        if watch:
            watch.stop()
    alerts = watch.events if watch else []
    stats = run.stats()
    if as_json_out:
        echo_json(as_json(stats, alerts, t0))
        return
    for line in summary_lines(stats, alerts, t0):
        click.echo(line)
