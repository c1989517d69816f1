"""``kc report DIR``: one self-contained HTML page (tables + PNGs) from a results folder.

Reads what the ``kc`` commands wrote there: ``rows.jsonl`` (``kc sweep --out``),
``kpred.json`` (``kc kpred --out``), ``verify.json`` (``kc verify --out``); any
may be missing. Plots are drawn with matplotlib (the ``viz`` extra), saved as
PNGs next to the page and embedded in it as data URIs, so the page can be
mailed or attached to a capacity review as one file.
"""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from kcops.kernels.sweep import FULL, POLICIES, Row, SweepError, recommend
from kcops.kernels.sweepio import ROWS_FILE, markdown

PAGE = "report.html"


def _rows(folder: Path) -> list[Row]:
    path = folder / ROWS_FILE
    if not path.exists():
        return []
    rows: dict[str, Row] = {}
    for line in path.read_text(encoding="utf-8").splitlines()[1:]:
        try:
            row = Row(**json.loads(line))
        except (ValueError, TypeError):
            continue
        rows[row.key] = row
    return list(rows.values())


def _png(fig: Any, path: Path) -> str:
    fig.savefig(path, dpi=100, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def sweep_plots(rows: list[Row], folder: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def kpred_plot(doc: dict[str, Any], folder: Path) -> str:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for v in sorted({r["variant"] for r in doc["rows"]}):
        ratios = sorted(r["k_pred"] / r["context"] for r in doc["rows"] if r["variant"] == v)
        ax.plot(ratios, [(i + 1) / len(ratios) for i in range(len(ratios))], label=v)
    ax.axvline(0.1, color="k", ls="--")
    ax.set_xlabel("K_pred / context")
    ax.set_ylabel("share of tokens")
    ax.set_title("K_pred (cumulative)")
    ax.legend()
    return _png(fig, folder / "kpred.png")


def verify_plot(doc: dict[str, Any], folder: Path) -> str:
    import matplotlib.pyplot as plt

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
    return _png(fig, folder / "verify.png")


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


def render(folder: Path, tolerance: float = 1.0) -> Path:
    """Write ``report.html`` (and the PNGs) into ``folder``; returns the page's path."""
    if not folder.is_dir():
        raise SweepError(f"{folder}: not a folder (give the --out folder of kc sweep)")
    rows = _rows(folder)
    kpred = folder / "kpred.json"
    ver = folder / "verify.json"
    if not rows and not kpred.exists() and not ver.exists():
        raise SweepError(f"{folder}: no {ROWS_FILE}, kpred.json or verify.json to report on")
    parts = ["<h1>kcops K(C) report</h1>"]
    if rows:
        rec = recommend(rows, tolerance)
        parts += ["<h2>Budget sweep</h2>", _md_table_html(markdown(rows, rec, tolerance))]
        parts += sweep_plots(rows, folder)
    if kpred.exists():
        doc = json.loads(kpred.read_text(encoding="utf-8"))
        parts.append("<h2>K_pred</h2><ul>")
        for v, s in doc["summary"].items():
            parts.append(
                f"<li>{html.escape(v)}: median {s['k_pred_median']}, p90 {s['k_pred_p90']}, "
                f"share needing &lt; 10% of context {s['share_below_10pct']:.2f}</li>"
            )
        parts += ["</ul>", kpred_plot(doc, folder)]
    if ver.exists():
        doc = json.loads(ver.read_text(encoding="utf-8"))
        parts.append(
            "<h2>Approximations vs full attention</h2><table><tr><th>variant</th>"
            "<th>max rel error</th><th>mean KL</th><th>agreement</th><th>pass</th></tr>"
        )
        for r in doc["results"]:
            ok = ", ".join(t for t, v in r["pass"].items() if v) or "none"
            parts.append(
                f"<tr><td>{html.escape(r['variant'])}</td><td>{r['max_rel_error']:.2e}</td>"
                f"<td>{r['mean_kl']:.2e}</td><td>{r['agreement']:.3f}</td>"
                f"<td>{html.escape(ok)}</td></tr>"
            )
        parts += ["</table>", verify_plot(doc, folder)]
    style = "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
    style += "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
    page = folder / PAGE
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>kcops K(C) report</title>"
        f"<style>{style}</style></head><body>{''.join(parts)}</body></html>",
        encoding="utf-8",
    )
    return page
