"""``kc claim``: the source documents' claim, decided from ``kc sweep`` folders.

The claim: a budget chosen from K(C) keeps the model's accuracy while cutting 30–50%
of inference resources. Per sweep folder and context, with the paired standard error
of each row's accuracy difference against full attention (same positions):

- **confirmed**: some budget that saves at least ``saving`` of the KV bytes loses at
  most ``tolerance`` points *with confidence* (Δ − 2 SE ≥ −tolerance);
- **refuted**: every budget that saves that much loses more than the tolerance with
  confidence (Δ + 2 SE < −tolerance);
- **undecided**: neither; the positions cannot tell (more of them would).

Beside the verdict: the smallest KV fraction kept within the tolerance with confidence
(the sweep's recommendation), its Δ ± SE, KV per sequence and decode speed ratio, and
what the sweep cost to run (``runs.jsonl``: wall time, peak RSS).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kcops.lab.sweep import FULL, Row, SweepError, recommend
from kcops.lab.sweepio import ROWS_FILE, RUNS_FILE, json_lines, read_rows

SAVING = 0.30  # the documents' "30–50%": the claim holds from its lower end


@dataclass
class Verdict:
    folder: str
    corpus: str
    context: int
    positions: int
    full_accuracy: float
    verdict: str  # confirmed | refuted | undecided
    why: str
    wall_s: float | None
    peak_rss_bytes: int | None
    policy: str | None = None  # the smallest KV within the tolerance with confidence
    n: int | None = None
    kv_fraction: float | None = None
    delta_points: float | None = None
    se_points: float | None = None
    kv_kib_per_seq: float | None = None
    tokens_per_s_ratio: float | None = None

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def read_folder(folder: Path) -> tuple[dict[str, object], list[Row]]:
    """The sweep's settings and its rows (the last measurement of each key)."""
    path = folder / ROWS_FILE
    if not path.is_file():
        raise SweepError(f"{folder}: no {ROWS_FILE} (give the --out folder of kc sweep)")
    settings, rows = read_rows(folder)
    if settings is None:
        raise SweepError(f"{path}: its first line is not a kc sweep settings header")
    return settings, rows


def run_cost(folder: Path) -> tuple[float | None, int | None]:
    """Total wall time and the largest peak RSS over the folder's invocations."""
    first, rest = json_lines(folder / RUNS_FILE)
    runs = [r for r in (first, *rest) if isinstance(r, dict)]
    if not runs:
        return None, None
    wall = round(sum(float(r.get("wall_s", 0.0)) for r in runs), 1)
    return wall, max(int(r.get("peak_rss_bytes", 0)) for r in runs)


def cells(rows: Sequence[Row]) -> Iterator[tuple[int, Row, list[Row]]]:
    """Per context with a full-attention row that holds KV: the context, that row and the
    context's budget rows."""
    for context in sorted({r.context for r in rows}):
        ctx = [r for r in rows if r.context == context]
        full = next((r for r in ctx if r.policy == FULL), None)
        if full is not None and full.kv_bytes:
            yield context, full, [r for r in ctx if r.policy != FULL]


def decide(
    rows: Sequence[Row], tolerance: float, saving: float = SAVING
) -> list[tuple[int, str, str]]:
    """Per context: ``(context, verdict, why)``."""
    out = []
    tol = tolerance / 100.0
    for context, full, budgeted in cells(rows):
        saving_rows = [r for r in budgeted if 1.0 - r.kv_bytes / full.kv_bytes >= saving]
        if not saving_rows:
            out.append((context, "undecided", f"no budget in the sweep saves {saving:.0%}"))
            continue

        def lo(r: Row, base: float = full.accuracy) -> float:
            return r.accuracy - base - 2 * r.delta_se

        def hi(r: Row, base: float = full.accuracy) -> float:
            return r.accuracy - base + 2 * r.delta_se

        good = [r for r in saving_rows if lo(r) >= -tol]
        if good:
            best = max(good, key=lambda r: 1.0 - r.kv_bytes / full.kv_bytes)
            why = (
                f"{best.policy} N={best.n} saves {1 - best.kv_bytes / full.kv_bytes:.0%} "
                f"with Δ − 2 SE = {100 * lo(best):+.1f} ≥ −{tolerance:g} pts"
            )
            out.append((context, "confirmed", why))
        elif all(hi(r) < -tol for r in saving_rows):
            closest = max(saving_rows, key=hi)
            why = (
                f"every budget saving ≥ {saving:.0%} loses more than {tolerance:g} pts with "
                f"confidence (the closest, {closest.policy} N={closest.n}: Δ + 2 SE = "
                f"{100 * hi(closest):+.1f})"
            )
            out.append((context, "refuted", why))
        else:
            open_rows = [r for r in saving_rows if hi(r) >= -tol]
            why = (
                f"{len(open_rows)} budget(s) saving ≥ {saving:.0%} could be within "
                f"{tolerance:g} pts but none is with confidence (more positions)"
            )
            out.append((context, "undecided", why))
    return out


def retrieval_rows(folder: Path) -> tuple[dict[str, object], list[Row]] | None:
    """A ``kc retrieve --out`` folder's pooled comparison as rows (None: not one): full
    attention's accuracy over the cells where it succeeds, each budget's paired Δ's SE
    and its KV ratio (against a full row of 1 MiB), so :func:`by_policy` decides it."""
    path = folder / "summary.json"  # kc retrieve writes it, kc sweep does not
    if not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    base, context = 1 << 20, max((c["length"] for c in doc["cells"]), default=0)

    def row(policy: str, n: int | None, acc: float, se: float, kv: float, items: int) -> Row:
        return Row(policy, n, context, acc, se, 1.0, math.nan, 0.0, 0.0, round(kv * base), 0.0,
                   items, [], accuracy_delta_se_seq=se)  # fmt: skip

    full = row(FULL, None, doc.get("succeeding_full_accuracy") or 0.0, 0.0, 1.0,
               int(doc.get("succeeding_items") or 0))  # fmt: skip
    rows = [full] + [
        row(e["policy"], e["n"], e["accuracy"], e["se_points"] / 100, e["kv_ratio"], e["items"])
        for e in doc["pooled"] if e["items"]
    ]  # fmt: skip
    return {"corpus": f"retrieval ({doc['settings']['task']})"}, rows


def methods(
    folders: Sequence[Path], tolerance: float, saving: float = SAVING, *, pooled: bool = False
) -> list[PolicyBest]:
    """:func:`by_policy` for each folder, ``kc sweep``'s or ``kc retrieve``'s (or the
    pooled sweep folders)."""
    read = [(f, *(retrieval_rows(f) or read_folder(f))) for f in folders]
    if pooled:
        settings, rows = pool(read)
        read = [(Path(" + ".join(str(f) for f in folders)), settings, rows)]
    out: list[PolicyBest] = []
    for _, settings, rows in read:
        out += by_policy(rows, tolerance, saving, str(settings.get("corpus")))
    return out


def verdicts(
    folders: Sequence[Path], tolerance: float, saving: float = SAVING, *, pooled: bool = False
) -> list[Verdict]:
    """One verdict per folder and context; ``pooled``: the folders are parts of one sweep
    (:func:`pool`) and get one verdict per context."""
    read = [(f, *read_folder(f), *run_cost(f)) for f in folders]
    if pooled:
        settings, rows = pool([(f, s, r) for f, s, r, _, _ in read])
        walls = [w for *_, w, _ in read if w is not None]
        rsss = [m for *_, m in read if m is not None]
        label = " + ".join(str(f) for f in folders)
        read = [
            (Path(label), settings, rows, sum(walls) if walls else None, max(rsss, default=None))
        ]
    out: list[Verdict] = []
    for folder, settings, rows, wall, rss in read:
        out += _verdicts(folder, settings, rows, wall, rss, tolerance, saving)
    return out


def pool(
    parts: Sequence[tuple[Path, dict[str, object], list[Row]]],
) -> tuple[dict[str, object], list[Row]]:
    """Parts of one sweep, run in batches of sequences (at 8k one batch of 8 fills 17-19
    GB): the same model and evaluated tokens, disjoint text. Each row measured in every
    part pools by position: accuracy and agreement are position-weighted means,
    perplexity the exponent of the mean log, KV and speed the parts' means. Its standard
    errors: by position, sqrt(Σ w² SE²); by sequence, the larger of the same over the
    parts' by-sequence errors and, from three parts on, the spread of the parts' own
    differences (sd / √parts), so texts that differ between parts are not hidden."""
    if len(parts) < 2:
        raise SweepError("--pool needs two or more sweep folders (the parts of one sweep)")
    first = parts[0][1]
    for folder, settings, _ in parts[1:]:
        for key in ("model", "eval_tokens"):
            if settings.get(key) != first.get(key):
                raise SweepError(
                    f"{folder}: {key} {settings.get(key)!r}, but {parts[0][0]} has "
                    f"{first.get(key)!r}: parts of one sweep share the model and --eval-tokens"
                )
    seen: dict[tuple[object, object], Path] = {}
    for folder, settings, _ in parts:
        text = (settings.get("corpus"), settings.get("sequences"))
        if text in seen:
            raise SweepError(
                f"{folder} and {seen[text]} read the same sequences of {text[0]!r}: "
                "pooled parts must hold different text"
            )
        seen[text] = folder
    by_part = [{r.key: r for r in rows} for _, _, rows in parts]
    keys = [k for k in by_part[0] if all(k in p for p in by_part[1:])]
    rows = [_pooled([p[k] for p in by_part], by_part) for k in keys]
    corpora = [str(s.get("corpus")) for _, s, _ in parts]
    settings = {
        "model": first.get("model"),
        "corpus": f"{len(parts)} parts: " + " + ".join(corpora),
        "sequences": sum(int(str(s.get("sequences") or 0)) for _, s, _ in parts),
        "eval_tokens": first.get("eval_tokens"),
    }
    return settings, rows


def _pooled(rows: Sequence[Row], by_part: Sequence[dict[str, Row]]) -> Row:
    total = sum(r.positions for r in rows)
    w = [r.positions / total for r in rows]
    k = len(rows)

    def mean(xs: Sequence[float]) -> float:
        return sum(wi * x for wi, x in zip(w, xs, strict=True))

    def combined(ses: Sequence[float]) -> float:
        return math.sqrt(sum((wi * se) ** 2 for wi, se in zip(w, ses, strict=True)))

    r0 = rows[0]
    se_seq: float | None = None
    seqs = [r.accuracy_delta_se_seq for r in rows]
    if all(x is not None for x in seqs):
        se_seq = combined([x or 0.0 for x in seqs])
    full = [next((f for f in p.values() if f.policy == FULL and f.context == r0.context), None)
            for p in by_part]  # fmt: skip
    if r0.policy != FULL and k >= 3 and all(f is not None for f in full):
        deltas = [r.accuracy - f.accuracy for r, f in zip(rows, full, strict=True) if f]
        m = sum(deltas) / k
        spread = math.sqrt(sum((d - m) ** 2 for d in deltas) / (k - 1)) / math.sqrt(k)
        se_seq = max(se_seq or 0.0, spread)
    return Row(
        policy=r0.policy,
        n=r0.n,
        context=r0.context,
        accuracy=mean([r.accuracy for r in rows]),
        accuracy_delta_se=combined([r.accuracy_delta_se for r in rows]),
        agreement=mean([r.agreement for r in rows]),
        perplexity=math.exp(mean([math.log(r.perplexity) for r in rows])),
        latency_s_per_token=sum(r.latency_s_per_token for r in rows) / k,
        tokens_per_s=sum(r.tokens_per_s for r in rows) / k,
        kv_bytes=round(sum(r.kv_bytes for r in rows) / k),
        keys_attended=sum(r.keys_attended for r in rows) / k,
        positions=total,
        budgets=r0.budgets,
        accuracy_delta_se_seq=se_seq,
    )


def _verdicts(
    folder: Path,
    settings: dict[str, object],
    rows: list[Row],
    wall: float | None,
    rss: int | None,
    tolerance: float,
    saving: float,
) -> list[Verdict]:
    out: list[Verdict] = []
    recs = {r["context"]: r for r in recommend(rows, tolerance)}
    for context, verdict, why in decide(rows, tolerance, saving):
        full = next(r for r in rows if r.context == context and r.policy == FULL)
        rec = recs.get(context, {})
        confident = rec.get("policy") is not None and not rec.get("within_noise", True)
        pick = (rec.get("policy"), rec.get("n"))
        row = next((r for r in rows if confident and r.context == context
                    and (r.policy, r.n) == pick), None)  # fmt: skip
        v = Verdict(str(folder), str(settings.get("corpus")), context, full.positions,
                    full.accuracy, verdict, why, wall, rss)  # fmt: skip
        if row is not None:
            v.policy, v.n, v.kv_fraction = row.policy, row.n, row.kv_bytes / full.kv_bytes
            v.delta_points, v.se_points = 100 * (row.accuracy - full.accuracy), 100 * row.delta_se
            v.kv_kib_per_seq = row.kv_bytes / 1024
            v.tokens_per_s_ratio = (
                row.tokens_per_s / full.tokens_per_s if full.tokens_per_s else None
            )
        out.append(v)
    return out


@dataclass
class PolicyBest:
    """One method in one cell: its largest KV saving within the tolerance with confidence
    (None: none), the Δ and its ±2 SE interval there, and its own verdict on the claim."""

    corpus: str
    context: int
    policy: str
    verdict: str
    saving: float | None = None
    n: int | None = None
    delta_points: float | None = None
    se_points: float | None = None
    wins: bool = False
    # every N measured: n, Δ and SE (points), KV fraction of full attention's
    rows: list[dict[str, float | int | None]] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def by_policy(
    rows: Sequence[Row], tolerance: float, saving: float = SAVING, corpus: str = ""
) -> list[PolicyBest]:
    """Per context and method (each policy, kcops' and kvpress's): :func:`decide` on that
    method's rows alone, and its largest saving with Δ − 2 SE ≥ −tolerance. The method
    with the largest such saving wins its context (ties: the larger Δ)."""
    out: list[PolicyBest] = []
    tol = tolerance / 100.0
    for context, full, budgeted in cells(rows):
        cell: list[PolicyBest] = []
        for policy in dict.fromkeys(r.policy for r in budgeted):
            mine = [r for r in budgeted if r.policy == policy]
            ((_, verdict, _),) = decide([full, *mine], tolerance, saving)
            good = [r for r in mine if r.accuracy - full.accuracy - 2 * r.delta_se >= -tol]
            item = PolicyBest(corpus, context, policy, verdict)
            item.rows = [{"n": r.n, "delta_points": 100 * (r.accuracy - full.accuracy),
                          "se_points": 100 * r.delta_se, "kv_fraction": r.kv_bytes / full.kv_bytes}
                         for r in sorted(mine, key=lambda r: r.kv_bytes)]  # fmt: skip
            if good:
                best = max(good, key=lambda r: (1 - r.kv_bytes / full.kv_bytes, r.accuracy))
                item.saving, item.n = 1.0 - best.kv_bytes / full.kv_bytes, best.n
                item.delta_points = 100 * (best.accuracy - full.accuracy)
                item.se_points = 100 * best.delta_se
            cell.append(item)
        ranked = [c for c in cell if c.saving is not None]
        if ranked:
            max(ranked, key=lambda c: (c.saving or 0.0, c.delta_points or 0.0)).wins = True
        out += cell
    return out


def markdown_by_policy(items: Sequence[PolicyBest], tolerance: float) -> str:
    lines = [
        f"| corpus | context | method | Δ ± SE (pts) at each KV fraction | largest KV saving "
        f"within {tolerance:g} pt (confident) | Δ ± 2 SE there | its verdict on the claim |",
        "|---|---:|---|---|---:|---|---|",
    ]
    for b in items:
        where = "—" if b.saving is None else f"{b.saving:.0%} (N={b.n})"
        if b.wins:
            where = f"**{where}** (best)"
        interval = (
            "—" if b.delta_points is None else f"{_pm(b.delta_points, 2 * (b.se_points or 0))}"
        )
        each = "; ".join(f"{_pm(r['delta_points'], r['se_points'])} ({r['kv_fraction']:.2f})"
                         for r in b.rows)  # fmt: skip
        lines.append(
            f"| {b.corpus} | {b.context} | {b.policy} | {each} | {where} | {interval} "
            f"| {b.verdict} |"
        )
    return "\n".join(lines) + "\n"


def markdown(items: Sequence[Verdict], tolerance: float, saving: float = SAVING) -> str:
    lines = [
        f"| corpus | context | positions | full acc | smallest KV within {tolerance:g} pt "
        "(confident) | KV fraction | Δ ± SE (pts) | KV MiB/seq | decode tokens/s vs full "
        f"| ≥ {saving:.0%} saving at kept accuracy | wall | peak RSS |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for v in items:
        pick = f"{v.policy} N={v.n}" if v.policy else "none"
        lines.append(
            f"| {v.corpus} | {v.context} | {v.positions} | {v.full_accuracy:.3f} | {pick} "
            f"| {_f(v.kv_fraction, '.3f')} "
            f"| {_pm(v.delta_points, v.se_points)} "
            f"| {_f(v.kv_kib_per_seq and v.kv_kib_per_seq / 1024, '.1f')} "
            f"| {_f(v.tokens_per_s_ratio, '.2f', '×')} | **{v.verdict}**: {v.why} "
            f"| {_dur(v.wall_s)} | {_gb(v.peak_rss_bytes)} |"
        )
    return "\n".join(lines) + "\n"


def _f(x: float | None, fmt: str, prefix: str = "") -> str:
    return "—" if x is None else f"{prefix}{x:{fmt}}"


def _pm(d: float | None, se: float | None) -> str:
    return "—" if d is None or se is None else f"{d:+.1f} ± {se:.1f}"


def _gb(b: int | None) -> str:
    return "—" if not b else f"{b / 1024**3:.1f} GB"


def _dur(s: float | None) -> str:
    if s is None:
        return "—"
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec:02d} s"
