"""Drive ``kc retrieve``: cells of (length, depth), items in batches, the resumable rows,
the per-cell table and the budget comparison over the cells where full attention succeeds.

``rows.jsonl`` in ``--out`` holds a header with the settings (model, task, seed, batch
size) and a line per (length, depth, item range, policy, N) with each item's
correctness; a rerun skips what is there, so more lengths, depths, items, policies
or budgets can be added to a folder later (item i of a cell never changes).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kcops.lab.retrieve import Builder, score_batch
from kcops.lab.sweep import FULL, paired_se, policy_rank
from kcops.lab.sweepio import ROWS_FILE, append_json, resume_lines

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

BATCH = 8  # items prefilled together (one cell, one length)


def _key(length: int, depth: float, lo: int, hi: int, policy: str, n: int | None) -> str:
    return f"{length}|{depth:g}|{lo}-{hi}|{policy}|{n}"


def load_done(out: Path, settings: dict[str, object]) -> dict[str, dict[str, Any]]:
    lines = resume_lines(out, settings, what="run")
    return {r["key"]: r for r in lines if isinstance(r, dict) and isinstance(r.get("key"), str)}


def run_retrieve(
    *, model_name: str, task: str, lengths: Sequence[int], depths: Sequence[float], items: int,
    ns: Sequence[int], policies: Sequence[str], seed: int, min_full: float, tolerance: float,
    out: Path | None, model: PreTrainedModel, tok: PreTrainedTokenizerBase, progress: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """The ``--json`` document: ``cells``, ``succeeding``, ``pooled``, ``recommendation``,
    ``markdown``."""
    from tqdm import tqdm

    settings = {"model": model_name, "task": task, "seed": seed, "batch": BATCH}
    done = load_done(out, settings) if out is not None else {}
    builder = Builder(tok, seed)
    plans: list[tuple[str, int | None]] = [(FULL, None)] + [(p, n) for p in policies for n in ns]
    rows: list[dict[str, Any]] = []
    batches = itertools.product(lengths, depths, range(0, items, BATCH))
    with tqdm(total=len(lengths) * len(depths) * items, desc="kc retrieve", unit="item",
              disable=not progress) as bar:  # fmt: skip
        for length, depth, lo in batches:
            hi = min(items, lo + BATCH)
            keys = [_key(length, depth, lo, hi, p, n) for p, n in plans]
            todo = [pl for pl, k in zip(plans, keys, strict=True) if k not in done]
            batch = [builder.item(task, length, depth, i) for i in range(lo, hi)] if todo else []
            for (p, n), res in zip(
                todo, score_batch(model, batch, todo) if todo else [], strict=True
            ):
                row = {"key": _key(length, depth, lo, hi, p, n), "length": length, "depth": depth,
                       "items": [lo, hi], "policy": p, "n": n, **res}  # fmt: skip
                done[row["key"]] = row
                if out is not None:
                    append_json(out / ROWS_FILE, row)
            rows += [done[k] for k in keys]
            bar.update(hi - lo)
            bar.set_postfix_str(f"L={length} depth={depth:g}")
    doc = summarize(rows, plans, min_full, tolerance)
    doc["settings"] = {**settings, "items": items, "min_full": min_full, "tolerance": tolerance}
    doc["markdown"] = markdown(doc)
    if out is not None:
        (out / "table.md").write_text(doc["markdown"], encoding="utf-8")
        summary = {k: v for k, v in doc.items() if k != "markdown"}
        (out / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return doc


def _compare(budget: list[bool], full: list[bool]) -> dict[str, float]:
    """Accuracy, Δ against full attention (points) and its paired SE (points)."""
    b, f = torch.tensor(budget, dtype=torch.long), torch.tensor(full, dtype=torch.long)
    one = torch.ones_like(b)
    acc = float(b.double().mean()) if len(budget) else 0.0
    delta = 100.0 * (acc - float(f.double().mean())) if len(full) else 0.0
    return {"accuracy": acc, "delta_points": delta, "se_points": 100.0 * paired_se(b, f, one)}


def summarize(
    rows: Sequence[dict[str, Any]],
    plans: Sequence[tuple[str, int | None]],
    min_full: float,
    tolerance: float,
) -> dict[str, Any]:
    # (length, depth, policy, n) -> item correctness in item order; kv bytes per (length, plan)
    correct: dict[tuple[int, float, str, int | None], list[bool]] = {}
    kv: dict[tuple[int, str, int | None], int] = {}
    for r in sorted(rows, key=lambda r: r["items"][0]):
        correct.setdefault((r["length"], r["depth"], r["policy"], r["n"]), []).extend(r["correct"])
        kv[(r["length"], r["policy"], r["n"])] = r["kv_bytes"]

    def ratio(length: int, p: str, n: int | None) -> float:
        return kv[(length, p, n)] / kv[(length, FULL, None)]

    cells: list[dict[str, Any]] = []
    for length, depth in dict.fromkeys((k[0], k[1]) for k in correct):
        full = correct[(length, depth, FULL, None)]
        budgets = [{"policy": p, "n": n, "kv_ratio": ratio(length, p, n),
                    **_compare(correct[(length, depth, p, n)], full)}
                   for p, n in plans[1:]]  # fmt: skip
        acc = sum(full) / len(full)
        cells.append({"length": length, "depth": depth, "items": len(full), "full_accuracy": acc,
                      "succeeds": acc >= min_full, "budgets": budgets})  # fmt: skip
    ok = [c for c in cells if c["succeeds"]]
    full_items = [x for c in ok for x in correct[(c["length"], c["depth"], FULL, None)]]
    pooled = []
    for p, n in plans[1:]:
        b = [x for c in ok for x in correct[(c["length"], c["depth"], p, n)]]
        ratios = [ratio(c["length"], p, n) for c in ok]
        entry: dict[str, Any] = {"policy": p, "n": n, "items": len(b), **_compare(b, full_items)}
        entry["kv_ratio"] = sum(ratios) / len(ratios) if ratios else None
        entry["holds"] = bool(b) and entry["delta_points"] - 2 * entry["se_points"] >= -tolerance
        pooled.append(entry)
    holding = [e for e in pooled if e["holds"]]
    rec = min(holding, key=lambda e: (e["kv_ratio"], e["n"], policy_rank(e["policy"])),
              default=None)  # fmt: skip
    neighbours: list[dict[str, Any]] = []
    if rec is not None:  # the recommended policy one grid step either side
        same = sorted((e for e in pooled if e["policy"] == rec["policy"]), key=lambda e: e["n"])
        i = same.index(rec)
        neighbours = same[max(0, i - 1) : i + 2]
    return {
        "cells": cells,
        "succeeding": [[c["length"], c["depth"]] for c in ok],
        "succeeding_items": len(full_items),
        "succeeding_full_accuracy": sum(full_items) / len(full_items) if full_items else None,
        "min_full": min_full,
        "tolerance": tolerance,
        "pooled": pooled,
        "recommendation": rec,
        "neighbours": neighbours,
    }


def markdown(doc: dict[str, Any]) -> str:
    budgets = doc["cells"][0]["budgets"] if doc["cells"] else []
    head = "| length | depth | items | full acc | "
    head += " | ".join(f"{b['policy']} {b['n']}" for b in budgets) + " |"
    lines = [head, "|---:|---:|---:|---:|" + "---:|" * (head.count("|") - 5)]
    for c in doc["cells"]:
        mark = "" if c["succeeds"] else " ✗"
        lines.append(
            f"| {c['length']} | {c['depth']:g} | {c['items']} | {c['full_accuracy']:.2f}{mark} | "
            + " | ".join(f"{b['delta_points']:+.0f} ± {b['se_points']:.0f}" for b in c["budgets"])
            + " |"
        )
    full = doc["succeeding_full_accuracy"]
    lines += [
        "",
        f"Cells where full attention succeeds (accuracy ≥ {doc['min_full']:g}, ✗: not): "
        f"{len(doc['succeeding'])} of {len(doc['cells'])}, {doc['succeeding_items']} items"
        + (f", full attention {full:.3f}" if full is not None else ""),
        "",
        "| policy | N | items | accuracy | Δ ± SE (pts, paired) | Δ − 2 SE | KV vs full |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for e in doc["pooled"]:
        if not e["items"]:  # no cell where full attention succeeds: nothing to compare
            lines.append(f"| {e['policy']} | {e['n']} | 0 | — | — | — | — |")
            continue
        kv = f"{e['kv_ratio']:.3f}" if e["kv_ratio"] is not None else "—"
        lines.append(
            f"| {e['policy']} | {e['n']} | {e['items']} | {e['accuracy']:.3f} "
            f"| {e['delta_points']:+.1f} ± {e['se_points']:.1f} "
            f"| {e['delta_points'] - 2 * e['se_points']:+.1f} | {kv} |"
        )
    rec = doc["recommendation"]
    lines.append("")
    if rec is None:
        lines.append(
            f"Recommendation: none — no budget has Δ − 2 SE ≥ −{doc['tolerance']:g} pts "
            "over the succeeding cells"
        )
    else:
        lines.append(
            f"Recommendation: **{rec['policy']} N={rec['n']}** (the smallest KV with Δ − 2 SE ≥ "
            f"−{doc['tolerance']:g} pts): Δ {rec['delta_points']:+.1f} ± {rec['se_points']:.1f} "
            f"pts over {rec['items']} items, KV {rec['kv_ratio']:.3f} of full"
        )
        for e in doc["neighbours"]:
            if e is not rec:
                lines.append(
                    f"- one grid step: {e['policy']} N={e['n']}: Δ {e['delta_points']:+.1f} ± "
                    f"{e['se_points']:.1f} pts over {e['items']} items"
                )
    return "\n".join(lines) + "\n"
