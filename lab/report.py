"""``kc report DIR``: one self-contained HTML page (tables + PNGs) from a results folder.

Reads what the ``kc`` commands wrote there: ``rows.jsonl`` (``kc sweep --out``),
``attention.npz`` (``kc measure --out``: attention heatmaps of sampled queries and
K_p per layer), ``kpred.json`` (``kc kpred --out``), ``verify.json`` (``kc verify
--out``); any may be missing. Plots are drawn with matplotlib (the ``viz``
extra), saved as PNGs next to the page and embedded in it as data URIs, so the
page can be mailed or attached to a capacity review as one file. With
``tensorboard=True`` the same pictures (and the sweep's agreement by N) also go
to TensorBoard event files (kcops.lab.mapviz).
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kcops.lab.maps import MAPS_FILE, AttentionMaps
from kcops.lab.sweep import FULL, POLICIES, Row, SweepError, recommend
from kcops.lab.sweepio import ROWS_FILE, markdown, read_rows

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from kcops.lab.verify import VerifyDoc

PAGE = "report.html"


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _png(fig: Figure, path: Path) -> str:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return _img(path)


def maps_section(maps: AttentionMaps, figures: dict[str, Figure], folder: Path) -> list[str]:
    """K_p per layer (table and plot) and the heatmaps, as PNGs next to the page."""
    from kcops.lab import mapviz  # matplotlib: the viz extra

    visible = maps.positions.astype(float) + 1.0
    parts = [
        "<h2>K(C) per layer</h2>",
        f"<p>{maps.kp.shape[1]} sampled queries at positions "
        f"{', '.join(str(int(x)) for x in maps.positions)}; K_{maps.p:g} is the union over "
        "the query heads of a KV group (largest group).</p>",
        f"<table><tr><th>layer</th><th>median K_{maps.p:g}</th><th>max</th><th>median κ</th></tr>",
    ]
    for layer in range(maps.kp.shape[0]):
        kp = maps.kp[layer]
        kappa = sorted(kp / visible)[len(kp) // 2]
        parts.append(
            f"<tr><td>{layer}</td><td>{sorted(kp)[len(kp) // 2]}</td><td>{kp.max()}</td>"
            f"<td>{kappa:.3f}</td></tr>"
        )
    parts.append("</table>")
    for tag, fig in figures.items():
        parts.append(_img(mapviz.save_png(fig, folder / mapviz.png_name(tag))))
    return parts


def sweep_plots(rows: list[Row], folder: Path) -> list[str]:
    from kcops.lab.mapviz import _plt

    plt = _plt()
    out = []
    for context in sorted({r.context for r in rows}):
        ctx = [r for r in rows if r.context == context]
        full = next((r for r in ctx if r.policy == FULL), None)
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for policy in POLICIES:
            mine = sorted((r for r in ctx if r.policy == policy), key=lambda r: r.n or 0)
            if not mine:
                continue
            ns = [r.n for r in mine]
            axes[0].plot(ns, [r.agreement for r in mine], marker="o", label=policy)
            axes[1].plot(ns, [r.accuracy for r in mine], marker="o", label=policy)
            axes[2].plot(ns, [r.kv_bytes / 2**10 for r in mine], marker="o", label=policy)
        if full is not None:
            axes[1].axhline(full.accuracy, color="k", ls="--", label="full attention")
            axes[2].axhline(full.kv_bytes / 2**10, color="k", ls="--", label="full attention")
        for ax, title in zip(
            axes, ("greedy agreement", "next-token accuracy", "KV KiB per sequence"), strict=True
        ):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("budget N")
            ax.set_title(f"{title}, context {context}")
            ax.legend(fontsize=8)
        out.append(_png(fig, folder / f"sweep_{context}.png"))
    return out


def kpred_section(doc: dict[str, Any], folder: Path) -> list[str]:
    """The K_pred summary and its cumulative plot."""
    import matplotlib.pyplot as plt

    parts = ["<h2>K_pred</h2><ul>"]
    for v, s in doc["summary"].items():
        parts.append(
            f"<li>{html.escape(v)}: median {s['k_pred_median']}, p90 {s['k_pred_p90']}, "
            f"share needing &lt; 10% of context {s['share_below_10pct']:.2f}</li>"
        )

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in sorted({r["variant"] for r in doc["rows"]}):
        ratios = sorted(r["k_pred"] / r["context"] for r in doc["rows"] if r["variant"] == v)
        ax.plot(ratios, [(i + 1) / len(ratios) for i in range(len(ratios))], label=v)
    ax.axvline(0.1, color="k", ls="--")
    ax.set_xlabel("K_pred / context")
    ax.set_ylabel("share of tokens")
    ax.set_title("K_pred (cumulative)")
    ax.legend()
    return [*parts, "</ul>", _png(fig, folder / "kpred.png")]


def verify_section(doc: VerifyDoc, folder: Path) -> list[str]:
    """The approximations' table and their per-layer errors."""
    import matplotlib.pyplot as plt

    parts = [
        "<h2>Approximations vs full attention</h2><table><tr><th>variant</th>"
        "<th>max rel error</th><th>mean KL</th><th>agreement</th><th>pass</th></tr>"
    ]
    for r in doc["results"]:
        ok = ", ".join(t for t, v in r["pass"].items() if v) or "none"
        parts.append(
            f"<tr><td>{html.escape(r['variant'])}</td><td>{r['max_rel_error']:.2e}</td>"
            f"<td>{r['mean_kl']:.2e}</td><td>{r['agreement']:.3f}</td>"
            f"<td>{html.escape(ok)}</td></tr>"
        )

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in doc["results"]:
        layers = r["layers"]
        errs = [max(x["rel_error"], 1e-12) for x in layers]
        ax.plot([x["layer"] for x in layers], errs, marker=".", label=r["variant"])
    for task, t in doc["thresholds"].items():
        ax.axhline(t, ls="--", color="gray")
        ax.text(0, t, task, fontsize=8)
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("relative output error")
    ax.legend(fontsize=8)
    return [*parts, "</table>", _png(fig, folder / "verify.png")]


def _md_table_html(md: str) -> str:
    """The sweep's Markdown table as an HTML table (pipes split, header row first)."""
    lines = [ln for ln in md.splitlines() if ln.startswith("|")]
    body = []
    for i, ln in enumerate(lines):
        if i == 1:
            continue
        cells = [html.escape(c.strip()) for c in ln.strip("|").split("|")]
        tag = "th" if i == 0 else "td"
        body.append("<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
    notes = [html.escape(ln) for ln in md.splitlines() if ln.startswith("- ")]
    return (
        "<table>"
        + "".join(body)
        + "</table><ul>"
        + "".join(f"<li>{n}</li>" for n in notes)
        + "</ul>"
    )


def render(folder: Path, tolerance: float = 1.0, tensorboard: bool = False) -> Path:
    """Write ``report.html`` (and the PNGs; with ``tensorboard``, event files under
    ``tensorboard/``) into ``folder``; returns the page's path."""
    if not folder.is_dir():
        raise SweepError(f"{folder}: not a folder (give the --out folder of kc sweep)")
    rows = read_rows(folder)[1]
    kpred = folder / "kpred.json"
    ver = folder / "verify.json"
    maps_path = folder / MAPS_FILE
    if not rows and not kpred.exists() and not ver.exists() and not maps_path.exists():
        raise SweepError(
            f"{folder}: no {ROWS_FILE}, {MAPS_FILE}, kpred.json or verify.json to report on"
        )
    parts = ["<h1>kcops K(C) report</h1>"]
    if rows:
        rec = recommend(rows, tolerance)
        parts += ["<h2>Budget sweep</h2>", _md_table_html(markdown(rows, rec, tolerance))]
        parts += sweep_plots(rows, folder)
    maps = AttentionMaps.load(maps_path) if maps_path.exists() else None
    figures: dict[str, Figure] = {}
    from kcops.lab import mapviz

    if maps is not None:
        figures = mapviz.maps_figures(maps)
        parts += maps_section(maps, figures, folder)
    if tensorboard:
        mapviz.write_tensorboard(folder, figures, maps, rows)
    if figures:
        import matplotlib.pyplot as plt

        for fig in figures.values():
            plt.close(fig)
    if kpred.exists():
        parts += kpred_section(json.loads(kpred.read_text(encoding="utf-8")), folder)
    if ver.exists():
        parts += verify_section(json.loads(ver.read_text(encoding="utf-8")), folder)
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
    style += "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
    page = folder / PAGE
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>kcops K(C) report</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>",
        encoding="utf-8",
    )
    return page
