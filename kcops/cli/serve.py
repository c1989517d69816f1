"""``kcops serve``: the reference inference worker (issue 4). torch is imported lazily."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from kcops.cli.common import EXIT_USAGE, FiniteFloat, handle_errors

if TYPE_CHECKING:
    from kcops.worker.state import WorkerState


@click.command(
    "serve", help="Run the reference inference worker (OpenAI-compatible, vLLM metrics)."
)
@click.option(
    "--model",
    default="smollm2",
    show_default=True,
    help="smollm2, tiny or a local HF model folder.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--redis", "redis_url", default=None, help="Redis URL of the KV cache tier.")
@click.option("--redis-prefix", default="kcops:kv:", show_default=True)
@click.option("--enable-faults", is_flag=True, help="Allow POST /admin/faults (drills only).")
@click.option("--token-file", type=click.Path(path_type=Path), default=None)
@click.option("--long-threshold", default=4096, show_default=True, type=click.IntRange(1))
@click.option("--top-n", default=64, show_default=True, type=click.IntRange(1))
@click.option("--topn-min", default=16, show_default=True, type=click.IntRange(1))
@click.option("--topn-max", default=1024, show_default=True, type=click.IntRange(1))
@click.option("--dense-layers", default="0,1", show_default=True, help="Layers that stay dense.")
@click.option("--shadow-fraction", default=0.0, show_default=True, type=FiniteFloat(0, 1))
@click.option(
    "--cache-budget-bytes", default=512 * 1024**2, show_default=True, type=click.IntRange(1)
)
@click.option("--cache-ttl-s", default=3600.0, show_default=True, type=FiniteFloat(min=1))
@click.option(
    "--threads", default=2, show_default=True, type=click.IntRange(1), help="torch threads."
)
@click.option("--pidfile", type=click.Path(path_type=Path), default=None)
@click.option("--no-probe", is_flag=True, help="Do not install the kcops.kernels probe.")
@click.option(
    "--start-delay-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Drills (with --enable-faults): wait the seconds this file holds before loading "
    "the model, as a slow model store would (missing or empty: no wait).",
)
@click.option(
    "--tenant-header",
    default="X-Tenant",
    show_default=True,
    help="Request header naming the tenant (else OpenAI's `user`); '' to use `user` only.",
)
@click.option(
    "--tenant-cap",
    default=50,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="Distinct tenant labels kept; later new tenants are `other`.",
)
@handle_errors
def serve_cmd(
    threads: int,
    token_file: Path | None,
    pidfile: Path | None,
    no_probe: bool,
    start_delay_file: Path | None,
    **flags: object,
) -> None:
    from kcops.auth import load_token
    from kcops.tenant import check_header_name

    # Every other flag is a WorkerOptions field of the same name.
    params = click.get_current_context().params
    try:
        header = check_header_name(params["tenant_header"]) if params["tenant_header"] else None
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tenant-header") from None
    dense = _check_usage(
        params["dense_layers"],
        params["top_n"],
        params["topn_min"],
        params["topn_max"],
        params["redis_url"],
    )
    token = load_token(token_file)
    if start_delay_file is not None:
        _start_delay(start_delay_file, params["enable_faults"])

    import torch

    from kcops.worker.app import WorkerOptions, build, install_probe
    from kcops.worker.control import BadSetting

    torch.set_num_threads(threads)
    given = {k: params[k] for k in flags}
    opts = WorkerOptions(
        **{**given, "token": token, "dense_layers": dense, "tenant_header": header}
    )
    try:
        state = build(opts)
    except BadSetting as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    probe = install_probe() if not no_probe else "probe off (--no-probe)"
    if token is None:
        click.echo("kcops serve: no token configured: admin endpoints answer 401", err=True)
    _serve(state, opts.host, opts.port, pidfile, probe)


def _check_usage(
    dense_layers: str, top_n: int, topn_min: int, topn_max: int, redis_url: str | None
) -> frozenset[int]:
    """Usage errors found before the model loads (exit 2); returns the dense layers."""
    from kcops.worker.control import BadSetting, parse_layers

    try:
        dense = parse_layers(dense_layers)
    except BadSetting as exc:
        raise click.UsageError(str(exc)) from None
    if not topn_min <= top_n <= topn_max:
        raise click.UsageError(
            f"--top-n {top_n} outside [--topn-min {topn_min}, --topn-max {topn_max}]"
        )
    if redis_url is not None and not redis_url.startswith(("redis://", "rediss://", "unix://")):
        click.echo(
            f"error: --redis {redis_url!r}: use a URL such as redis://127.0.0.1:6379/0 "
            "(schemes: redis, rediss, unix)",
            err=True,
        )
        sys.exit(EXIT_USAGE)
    return dense


def _start_delay(path: Path, enable_faults: bool) -> None:
    """A start-slow drill: the delay really holds back the model load (and so readiness)."""
    import time

    from kcops.worker.faults import BadFault, start_delay_s

    if not enable_faults:
        raise click.UsageError("--start-delay-file is a fault drill: it needs --enable-faults")
    try:
        delay = start_delay_s(path)
    except BadFault as exc:
        raise click.UsageError(str(exc)) from None
    if delay > 0:
        click.echo(f"kcops serve: fault drill: start delayed {delay:g}s ({path})", err=True)
        time.sleep(delay)


def _serve(state: WorkerState, host: str, port: int, pidfile: Path | None, probe: str) -> None:
    """Serve until SIGTERM or Ctrl-C; the pidfile lives exactly as long as the server."""
    from kcops.worker.app import serve_forever

    # SIGTERM (supervisor, restart_worker) exits through the finally below.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    if pidfile is not None:
        pidfile.write_text(f"{os.getpid()}\n")
    click.echo(
        f"kcops serve: {state.model_name} on http://{host}:{port} "
        f"(context {state.context_tokens}, {probe})",
        err=True,
    )
    try:
        serve_forever(state, host, port)
    except KeyboardInterrupt:
        pass
    finally:
        if pidfile is not None:
            pidfile.unlink(missing_ok=True)
