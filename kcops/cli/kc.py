"""``kcops kc``: K(C), how many context tokens the model's attention really uses.

``kc recommend`` reads a running agent (production, torch-free). The offline measurements
(``measure``, ``sweep``, ``kpred``, ``verify``, ``report``, ``claim``, ``retrieve``) are the
lab's, in :mod:`kcops.lab.cli`, installed with kcops-lab.
"""

from __future__ import annotations

import click

from kcops.cli.lazy import LazyGroup

KC_COMMANDS: dict[str, tuple[str, str]] = {
    "recommend": ("kcops.cli.kc_recommend", "recommend_cmd"),
    "measure": ("kcops.lab.cli", "measure_cmd"),
    "sweep": ("kcops.lab.cli", "sweep_cmd"),
    "kpred": ("kcops.lab.cli", "kpred_cmd"),
    "verify": ("kcops.lab.cli", "verify_cmd"),
    "report": ("kcops.lab.cli", "report_cmd"),
    "claim": ("kcops.lab.cli", "claim_cmd"),
    "retrieve": ("kcops.lab.cli", "retrieve_cmd"),
}


@click.group(
    "kc",
    cls=LazyGroup,
    lazy=KC_COMMANDS,
    help="K(C): how many context tokens the model's attention really uses.",
)
def kc_group() -> None:
    pass
