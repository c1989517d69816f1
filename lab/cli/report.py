"""``kcops kc report``: one page of tables and pictures from a sweep folder."""

from __future__ import annotations

from pathlib import Path

import click

from kcops.cli.common import FiniteFloat, handle_errors


@click.command("report")
@click.argument("folder")
@click.option("--tolerance", type=FiniteFloat(0.0, 100.0), default=1.0, show_default=True)
@click.option(
    "--tensorboard",
    is_flag=True,
    help="Also write the pictures as TensorBoard event files under FOLDER/tensorboard.",
)
@handle_errors
def report_cmd(folder: str, tolerance: float, tensorboard: bool) -> None:
    """One HTML page (tables + PNGs) from the --out folder of kc sweep / measure / kpred /
    verify."""
    import importlib.util

    try:
        import matplotlib  # noqa: F401  (the viz extra)
    except ImportError as exc:
        msg = f"kc report needs the viz extra (pip install kcops[viz]): {exc}"
        raise click.ClickException(msg) from None
    if tensorboard and importlib.util.find_spec("tensorboard") is None:
        msg = "kc report --tensorboard needs the tensorboard package (pip install kcops[viz])"
        raise click.ClickException(msg)
    from kcops.lab.report import render

    page = render(Path(folder), tolerance, tensorboard=tensorboard)
    click.echo(str(page))
    if tensorboard:
        click.echo(str(Path(folder) / "tensorboard"))
