"""PNG plots of a :class:`Timeline` with matplotlib (Agg, no display), one per panel.

Every panel has the same width and x range, so the page reads as one shared
time axis: alert intervals are shaded bands on each panel (amber pending, red
firing), actions are dashed vertical markers, and a last panel lists each
alert as its own row with the actions labelled.
"""

from __future__ import annotations

import io
import math
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from kcops.cli.common import Doc
from kcops.cli.report.timeline import PANELS, PlotPanel, Timeline

if TYPE_CHECKING:
    from matplotlib.figure import Figure

WIDTH_IN, HEIGHT_IN, DPI = 10.0, 2.2, 100  # 1000 x 220 px per panel
BAND = {"pending": "#f5c542", "firing": "#e0443e"}


def _pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts).astimezone()


def acted(tl: Timeline) -> list[Doc]:
    """Actions that ran (or were rehearsed): a guard's skip is in the table, not on the plot."""
    return [r for r in tl.actions if not str(r.get("outcome", "")).startswith("skipped")]


def _decorate(ax: Any, tl: Timeline) -> None:  # matplotlib takes datetimes, its stubs not
    import matplotlib.dates as mdates

    ax.set_xlim(_dt(tl.start), _dt(tl.end))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=_dt(tl.start).tzinfo))
    ax.grid(True, alpha=0.3)
    for iv in tl.intervals:
        ax.axvspan(_dt(iv.start), _dt(iv.end), color=BAND.get(iv.state, "#999"), alpha=0.15, lw=0)
    for rec in acted(tl):
        ax.axvline(_dt(float(rec["ts"])), color="#333", ls="--", lw=0.8, alpha=0.7)


def _figure() -> tuple[Figure, Any]:  # Axes, fed datetimes (see _decorate)
    # Fixed margins, not a layout engine: every panel's plot area spans the same
    # pixels, so one instant is at the same x on every image of the page.
    fig, ax = _pyplot().subplots(figsize=(WIDTH_IN, HEIGHT_IN))
    fig.subplots_adjust(left=0.2, right=0.99, bottom=0.14, top=0.88)
    return fig, ax


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    _pyplot().close(fig)
    return buf.getvalue()


def panel_png(tl: Timeline, panel: PlotPanel) -> bytes:
    fig, ax = _figure()
    xs = [_dt(t) for t in tl.times]
    drawn = False
    for label, vals in tl.series[panel.key].items():
        if any(math.isfinite(v) for v in vals):
            ax.plot(xs, vals, label=label, lw=1.4)
            drawn = True
    if panel.ylim:
        ax.set_ylim(*panel.ylim)
    if drawn:
        ax.legend(loc="upper left", fontsize=7, frameon=False)
    else:
        ax.text(0.5, 0.5, "no data in this window", transform=ax.transAxes, ha="center",
                va="center", color="#888")  # fmt: skip
    ax.set_title(panel.title, fontsize=9, loc="left")
    ax.set_ylabel(panel.unit, fontsize=8)
    ax.tick_params(labelsize=7)
    _decorate(ax, tl)
    return _png(fig)


def alerts_png(tl: Timeline) -> bytes:
    """Each alert on its own row, pending and firing as bars; actions labelled."""
    names = sorted({iv.alertname for iv in tl.intervals})
    fig, ax = _figure()
    rows = {n: i for i, n in enumerate(names)}
    for iv in tl.intervals:
        ax.barh(rows[iv.alertname], (iv.end - iv.start) / 86400, left=_dt(iv.start),
                color=BAND.get(iv.state, "#999"), height=0.6)  # fmt: skip
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_ylim(-0.7, max(len(names), 1) - 0.3)
    for rec in acted(tl):
        ax.annotate(f"{rec.get('action')} ({rec.get('outcome')})", (_dt(float(rec["ts"])), -0.6),
                    fontsize=6, rotation=90, va="bottom", ha="right", color="#333")  # fmt: skip
    if not names:
        ax.text(0.5, 0.5, "no alert was pending or firing", transform=ax.transAxes,
                ha="center", va="center", color="#888")  # fmt: skip
    ax.set_title("Alerts (amber pending, red firing) and actions", fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    _decorate(ax, tl)
    return _png(fig)


def all_pngs(tl: Timeline) -> list[tuple[str, bytes]]:
    """(title, PNG bytes) for every panel, the alerts panel last."""
    out = [(p.title, panel_png(tl, p)) for p in PANELS]
    out.append(("Alerts and actions", alerts_png(tl)))
    return out
