"""``kcops demo``: the whole loop on this machine, with real parts.

It starts a real Redis (when installed), the agent in enforce mode supervising
the reference worker with a real small model and the probe, sends real load
with Locust (:mod:`kcops.demo.load`), then runs fault drills
(:mod:`kcops.demo.drills`) and shows the agent detect and repair each:
by default a NaN in attention (``KcopsAttentionErrors`` -> ``fallback_to_base``)
and a hung loop (``KcopsEngineDown`` -> ``restart_worker``); ``--drills all``
runs every alert of the table whose cause the worker can produce. It ends with
a table of the drills and one HTML report with plots of the whole run.

Every step has a deadline; a step that does not happen says so and the demo
exits 1. Logs, Locust's stats, the audit log and the report stay in the work folder.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from kcops.cli.common import EXIT_FAILURE, FiniteFloat, handle_errors
from kcops.cli.timefmt import duration
from kcops.demo import drills as drills_mod
from kcops.demo.env import LOAD_USERS, DemoEnv, DemoFailed, kcops_exe, summary
from kcops.demo.load.run import summary_lines

CONTEXT_HINT = "see the logs in {work}"


def _drills(env: DemoEnv, chosen: list[drills_mod.Drill]) -> list[drills_mod.DrillResult]:
    results = []
    for drill in chosen:
        results.append(drills_mod.run_drill(env, drill))
        if drill.needs is None and drill is not chosen[-1]:
            # A ladder's fallback holds the route on the base model; the next drill
            # needs the optimized path (shadow checks, K(C) on top-N) back.
            env.reset_route()
    if results:
        drills_mod.settle(env, results, timeout_s=300 + drills_mod.estimate_s(chosen) / 4)
    return results


def _report(env: DemoEnv, t0: float) -> None:
    try:
        from kcops.cli.report.cmd import write_report

        path = write_report(env.agent, t0, time.time(), env.work / "report.html", "kcops demo")
        click.echo(f"- report with plots of the whole run: {path}")
    except Exception as exc:  # the report is a view of the run, not part of its verdict
        click.echo(f"- no report: {exc}")


def _audit_tail(env: DemoEnv) -> None:
    click.echo("- audit log (kcops actions history):")
    hist = subprocess.run(
        [kcops_exe(), "actions", "history", "--state-dir", str(env.state_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    for line in hist.stdout.splitlines()[-12:] or ["(no actions)"]:
        click.echo("    " + line)


def run_demo(env: DemoEnv, chosen: list[drills_mod.Drill], load_seconds: float) -> bool:
    """Start everything, load, drill, report. True when every drill run did its job."""
    t0 = time.time()
    env.make_cgroup()
    env.start_agent(env.start_redis())
    env.set_load_mode("mixed")
    load = env.start_locust("locust", LOAD_USERS)
    env.load_since = time.time()
    click.echo(
        f"- real load with Locust for {load_seconds:.0f}s ({LOAD_USERS} user, CPython docs prompts)"
    )
    time.sleep(load_seconds)
    env.limit_device()
    click.echo("- what the agent sees (asked through its query API):")
    for line in summary(env.agent):
        click.echo("    " + line)
    # A healthy engine raises no alarm: nothing pending from the start to the first drill.
    before = env.alerts_since(t0)
    click.echo(f"- alerts pending or firing before the drills: {', '.join(before) or 'none'}")
    try:
        results = _drills(env, chosen)
    finally:
        load.stop()
    click.echo("- load, from Locust's own statistics:")
    for line in summary_lines(load.stats(), [], t0):
        click.echo("    " + line)
    _audit_tail(env)
    if results:
        click.echo("- drills:")
        for line in drills_mod.table(results):
            click.echo("    " + line)
    _report(env, t0)
    ran = [r for r in results if not r.note.startswith("not run")]
    return all(r.ok for r in ran)


@click.command(
    "demo",
    help=(
        "Run the whole loop here: Redis, the agent supervising the reference worker "
        "(real model, probe), real load with Locust, then fault drills that the agent "
        "detects and repairs by itself; ends with a drill table and an HTML report."
    ),
)
@click.option(
    "--model", default="smollm2", show_default=True, help="Worker model: smollm2, tiny or PATH."
)
@click.option(
    "--load-seconds",
    default=20.0,
    show_default=True,
    type=FiniteFloat(0, 86400),
    help="Healthy load phase length.",
)
@click.option(
    "--drills", "drill_spec", default="default", show_default=True,
    help="default (NaN, hang), all, none, or alert names separated by commas.",
)  # fmt: skip
@click.option("--no-drills", is_flag=True, help="Same as --drills none.")
@click.option("--workdir", type=click.Path(file_okay=False), help="Keep logs here (default: tmp).")
@handle_errors
def demo_cmd(
    model: str, load_seconds: float, drill_spec: str, no_drills: bool, workdir: str | None
) -> None:
    chosen = drills_mod.select("none" if no_drills else drill_spec)
    work = Path(workdir or tempfile.mkdtemp(prefix="kcops-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    click.echo(f"kcops demo — work folder {work}")
    if chosen:
        names = ", ".join(d.alert for d in chosen if d.needs is None)
        click.echo(
            f"- drills: {names}; about {duration(drills_mod.estimate_s(chosen))} "
            f"plus start-up (rule params for the demo: {drills_mod.DEMO_PARAMS}; "
            f"`for` at most {drills_mod.DEMO_MAX_FOR}, `keep_firing_for` at most "
            f"{drills_mod.DEMO_MAX_KEEP_FIRING_FOR})"
        )
    env_ = DemoEnv(
        work, model, drills_mod.DEMO_PARAMS,
        max_for=drills_mod.DEMO_MAX_FOR, max_keep_firing_for=drills_mod.DEMO_MAX_KEEP_FIRING_FOR,
    )  # fmt: skip
    with env_ as env:
        try:
            ok = run_demo(env, chosen, load_seconds)
        except DemoFailed as exc:
            click.echo(f"demo failed: {exc}; " + CONTEXT_HINT.format(work=work), err=True)
            sys.exit(EXIT_FAILURE)
    if not ok:
        click.echo("demo failed: a drill did not fire, act or resolve (table above)", err=True)
        sys.exit(EXIT_FAILURE)
    click.echo(f"demo ok — logs, Locust stats, audit log and report in {work}")
