"""Pictures of K(C): attention heatmaps of sampled queries and K_p per layer.

Drawn with matplotlib (the ``viz`` extra) at a fixed size (``FIG_SIZE_IN`` at
``DPI``, no tight cropping, so a PNG is always ``PNG_SIZE_PX``), and the same
figures written as TensorBoard event files with ``torch.utils.tensorboard``
(needs the ``tensorboard`` package, also in ``viz``): images under
``attention/query_<pos>`` and ``kc/K_p_per_layer``, scalars ``kc/K_p<p>_median``
and ``kc/kappa_median`` with the layer as the step, and, from a sweep,
``sweep/<policy>/agreement_C<context>`` with N as the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np

from kcops.lab.maps import AttentionMaps
from kcops.lab.sweep import FULL, Row, SweepError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FIG_SIZE_IN = (8.0, 4.0)
DPI = 100
PNG_SIZE_PX = (800, 400)  # width, height
TB_FOLDER = "tensorboard"
FLOOR = 1e-6  # weights below this are drawn as the floor (log colour scale)


def _plt() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def heatmap_figure(maps: AttentionMaps, row: int) -> Figure:
    """Layers (rows) x key positions (columns) for one sampled query, log10 of the
    head-mean weight."""
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    pos = int(maps.positions[row])
    w = np.maximum(maps.weights[:, row, : pos + 1], FLOOR)
    fig, ax = plt.subplots(figsize=FIG_SIZE_IN, dpi=DPI)
    im = ax.imshow(np.log10(w), aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("key position")
    ax.set_ylabel("layer")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    kp = int(np.median(maps.kp[:, row]))
    ax.set_title(f"query t={pos}: log10 weight, mean of heads; median K_{maps.p:g} {kp}")
    fig.colorbar(im, ax=ax)
    return fig


def kp_figure(maps: AttentionMaps) -> Figure:
    """Median K_p per layer over the sampled rows, with their min-max range, and κ."""
    from matplotlib.ticker import MaxNLocator

    plt = _plt()
    layers = np.arange(maps.kp.shape[0])
    visible = maps.positions.astype(np.float64) + 1.0
    kappa = maps.kp / visible[None, :]
    fig, ax = plt.subplots(figsize=FIG_SIZE_IN, dpi=DPI)
    ax.fill_between(layers, maps.kp.min(1), maps.kp.max(1), alpha=0.25, label="range over queries")
    ax.plot(layers, np.median(maps.kp, 1), marker="o", label=f"median K_{maps.p:g}")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"K_{maps.p:g} (keys)")
    ax2 = ax.twinx()
    ax2.plot(layers, np.median(kappa, 1), color="k", ls="--", label="median κ = K/t")
    ax2.set_ylabel("κ")
    ax.set_title(f"K_{maps.p:g} per layer over {maps.kp.shape[1]} sampled queries")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    return fig


def save_png(fig: Figure, path: Path) -> Path:
    """At the fixed size: no tight bounding box."""
    fig.savefig(path, dpi=DPI)
    return path


def maps_figures(maps: AttentionMaps) -> dict[str, Figure]:
    """Tag -> figure, in display order: K_p per layer first, then one heatmap per query."""
    figs = {"kc/K_p_per_layer": kp_figure(maps)}
    for i, pos in enumerate(maps.positions):
        figs[f"attention/query_{int(pos)}"] = heatmap_figure(maps, i)
    return figs


def png_name(tag: str) -> str:
    return tag.replace("/", "_") + ".png"


def write_tensorboard(
    folder: Path, figures: dict[str, Figure], maps: AttentionMaps | None, rows: Sequence[Row]
) -> Path:
    """Event files under ``folder/tensorboard``; returns that folder."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise SweepError(
            f"--tensorboard needs the tensorboard package (pip install kcops[viz]): {exc}"
        ) from None
    out = folder / TB_FOLDER
    writer = SummaryWriter(log_dir=str(out))
    try:
        for tag, fig in figures.items():
            writer.add_figure(tag, fig, close=False)
        if maps is not None:
            visible = maps.positions.astype(np.float64) + 1.0
            for layer in range(maps.kp.shape[0]):
                writer.add_scalar(
                    f"kc/K_p{maps.p:g}_median", float(np.median(maps.kp[layer])), layer
                )
                kappa = float(np.median(maps.kp[layer] / visible))
                writer.add_scalar("kc/kappa_median", kappa, layer)
        for r in rows:
            if r.policy != FULL and r.n is not None:
                writer.add_scalar(f"sweep/{r.policy}/agreement_C{r.context}", r.agreement, r.n)
                writer.add_scalar(f"sweep/{r.policy}/accuracy_C{r.context}", r.accuracy, r.n)
    finally:
        writer.close()
    return out
