"""``kc sweep`` output: the resumable row cache, the Markdown and CSV tables.

Rows are appended to ``rows.jsonl`` in the output folder as soon as they are
measured, keyed by policy, N and context, under a header line that names the
run's settings; a second run with the same settings skips them (resume), a run
with different settings refuses the folder rather than mixing numbers. Each
invocation appends its wall time and peak RSS to ``runs.jsonl``.
"""

from __future__ import annotations

import csv
import datetime
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kcops.lab.sweep import FULL, Recommendation, Row, SweepError

if TYPE_CHECKING:
    from kcops.lab.sweepcal import Coverage

ROWS_FILE = "rows.jsonl"
RUNS_FILE = "runs.jsonl"
COLUMNS = (
    "policy", "n", "context", "accuracy", "accuracy_delta_se", "accuracy_delta_se_seq",
    "agreement", "perplexity", "latency_s_per_token", "tokens_per_s", "kv_bytes",
    "keys_attended", "positions",
)  # fmt: skip


def json_lines(path: Path) -> tuple[object, list[object]]:
    """The first line of a JSON-lines file (None when it is missing or not JSON) and the
    others; a line cut by an interrupted run is left out (it is measured again)."""
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    docs: list[object] = []
    for line in lines:
        try:
            docs.append(json.loads(line))
        except ValueError:
            docs.append(None)
    return (docs[0] if docs else None), [d for d in docs[1:] if d is not None]


def resume_lines(out: Path, settings: dict[str, object], what: str = "sweep") -> list[object]:
    """The JSON lines already written under the same ``settings`` (a new folder gets the
    settings header and none); a cut line is left out and the file made to end a line.
    Other settings refuse the folder."""
    path = out / ROWS_FILE
    if not path.exists():
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"settings": settings}) + "\n", encoding="utf-8")
        return []
    head, rows = json_lines(path)
    if (head.get("settings") if isinstance(head, dict) else None) != settings:
        held = head.get("settings") if isinstance(head, dict) else None
        raise SweepError(
            f"{path} holds a {what} with other settings ({held}); "
            "use another --out folder or delete it"
        )
    if not path.read_text(encoding="utf-8").endswith("\n"):  # the next row starts a line
        with path.open("a", encoding="utf-8") as fh:
            fh.write("\n")
    return rows


def _by_key(docs: Iterable[object]) -> dict[str, Row]:
    """The last row of each key among parsed lines; one that is not a row (a cut line
    that still parsed as JSON) is left out."""
    rows: dict[str, Row] = {}
    for doc in docs:
        try:
            row = Row(**doc) if isinstance(doc, dict) else None
        except TypeError:
            continue
        if row is not None:
            rows[row.key] = row
    return rows


def load_done(out: Path, settings: dict[str, object]) -> dict[str, Row]:
    """Rows already measured under the same ``settings`` (empty for a new folder)."""
    return _by_key(resume_lines(out, settings))


def read_rows(folder: Path) -> tuple[dict[str, object] | None, list[Row]]:
    """A sweep folder read without touching it: its settings header (None when the first
    line is not one) and its rows, the last measurement of each key. No ``rows.jsonl``:
    no settings and no rows."""
    head, docs = json_lines(folder / ROWS_FILE)
    settings = head.get("settings") if isinstance(head, dict) else None
    return (settings if isinstance(settings, dict) else None), list(_by_key(docs).values())


def append_json(path: Path, doc: object) -> None:
    """One more line of a JSON-lines file (``rows.jsonl``, ``runs.jsonl``)."""
    with path.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(doc) + "\n")


def run_record(began: float, measured: int) -> dict[str, object]:
    """What one invocation cost: wall time since ``began`` (``time.monotonic``), this
    process's peak RSS (the model, the prefill and the decode caches), rows measured."""
    import resource
    import time

    return {
        "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - began, 1),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rows_measured": measured,
    }


def _full(rows: Sequence[Row], context: int) -> Row | None:
    return next((r for r in rows if r.context == context and r.policy == FULL), None)


def markdown(rows: Sequence[Row], rec: Sequence[Recommendation], tolerance: float) -> str:
    lines = [
        "| policy | N | context | accuracy | Δ acc ± SE (pts) | agreement | perplexity "
        "| ms/token | tokens/s | KV KiB/seq | KV vs full | keys attended |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        full = _full(rows, r.context)
        d_acc = 100.0 * (r.accuracy - full.accuracy) if full else 0.0
        kv_ratio = r.kv_bytes / full.kv_bytes if full and full.kv_bytes else 1.0
        lines.append(
            f"| {r.policy} | {r.n if r.n is not None else '—'} | {r.context} "
            f"| {r.accuracy:.3f} | {d_acc:+.1f} ± {100 * r.delta_se:.1f} "
            f"| {r.agreement:.3f} | {r.perplexity:.2f} "
            f"| {1000 * r.latency_s_per_token:.1f} | {r.tokens_per_s:.1f} "
            f"| {r.kv_bytes / 1024:.0f} | {kv_ratio:.3f} | {r.keys_attended:.0f} |"
        )
    lines += [
        "",
        f"Recommendation (the smallest KV whose accuracy is within {tolerance:g} point(s) of "
        f"full attention with confidence, Δ − 2 SE ≥ −{tolerance:g}):",
    ]
    for item in rec:
        if item.get("policy") is None:
            lines.append(f"- context {item['context']}: no budget stays within the tolerance")
            continue
        lines.append(
            f"- context {item['context']}: **{item['policy']} N={item['n']}** — "
            f"accuracy {item['accuracy_delta_points']:+.1f} ± "
            f"{item['accuracy_delta_se_points']:.1f} pts (paired SE), agreement "
            f"{item['agreement']:.3f}, KV bytes −{100 * item['kv_bytes_saved_ratio']:.0f}%, "
            f"decode tokens/s ×{item['tokens_per_s_ratio']:.2f}"
            + (
                f" — within noise: no budget has Δ − 2 SE ≥ −{tolerance:g} pts; this is the "
                "smallest whose Δ alone is within the tolerance, and these positions cannot "
                "tell it from a larger loss (more --sequences / --eval-tokens)"
                if item["within_noise"]
                else ""
            )
        )
        cov = item.get("kc_coverage")
        if cov and cov.get("quantile") is not None:
            lines.append(
                f"  - K(C) coverage of N={item['n']} (the live recommendation's calibration): "
                f"K_{cov['p']:g} at call quantile {cov['quantile']:.3f} ({cov['match']}, "
                f"{cov['layers']} layers, {cov['samples_per_layer']} rows a layer)"
                + _other_layers(cov)
            )
    return "\n".join(lines) + "\n"


def _other_layers(cov: Coverage) -> str:
    """The coverage over the other layer set (``by_layers``), when the sweep recorded it."""
    other = "non_dense" if cov.get("layers") == "all" else "all"
    got = cov["by_layers"].get(other, {"by_p": {}})["by_p"].get(f"{cov['p']:g}")
    if not got:
        return ""
    return f"; over {other} layers: call quantile {got['quantile']:.3f} ({got['match']})"


def write_tables(
    out: Path, rows: Sequence[Row], rec: Sequence[Recommendation], tolerance: float
) -> None:
    (out / "table.md").write_text(markdown(rows, rec, tolerance), encoding="utf-8")
    with (out / "table.csv").open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(COLUMNS)
        for r in rows:
            d = r.as_json()
            w.writerow(["" if d[c] is None else d[c] for c in COLUMNS])
    (out / "recommendation.json").write_text(json.dumps(list(rec), indent=2), encoding="utf-8")
