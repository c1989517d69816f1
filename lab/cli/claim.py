"""``kcops kc claim``: is "30–50% less KV at kept accuracy" true on these sweeps?

Reads ``kc sweep --out`` folders only (no model, no torch at import beyond the
kernels' sweep module): see :mod:`kcops.lab.sweepclaim`."""

from __future__ import annotations

from pathlib import Path

import click

from kcops.cli.common import FiniteFloat, echo_json, handle_errors


@click.command("claim")
@click.argument("folders", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option(
    "--tolerance",
    type=FiniteFloat(0.0, 100.0),
    default=1.0,
    show_default=True,
    help="Accuracy points below full attention still counted as kept.",
)
@click.option(
    "--saving",
    type=FiniteFloat(0.01, 0.99),
    default=0.30,
    show_default=True,
    help="KV bytes saved that the claim promises (the documents say 30–50%).",
)
@click.option(
    "--pool",
    "pooled",
    is_flag=True,
    help="The FOLDERS are parts of one sweep run in batches of sequences (disjoint text, "
    "the same model and --eval-tokens; at 8k one batch of 8 fills 17-19 GB): pool them "
    "into one verdict per context.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
@handle_errors
def claim_cmd(
    folders: tuple[str, ...], tolerance: float, saving: float, pooled: bool, as_json: bool
) -> None:
    """Decide the K(C) claim on sweep folders: per corpus and context, confirmed (a budget
    saving SAVING of the KV keeps accuracy within TOLERANCE points with confidence,
    Δ − 2 SE ≥ −TOLERANCE), refuted (every such budget loses more, Δ + 2 SE < −TOLERANCE)
    or undecided; beside it the smallest KV kept within the tolerance, and the sweep's
    wall time and peak RSS."""
    from kcops.lab.sweepclaim import markdown, verdicts

    items = verdicts([Path(f) for f in folders], tolerance, saving, pooled=pooled)
    if as_json:
        echo_json([v.as_json() for v in items])
    else:
        click.echo(markdown(items, tolerance, saving), nl=False)
