"""``kcops cost --agent URL --since 24h``: queries, context and cost by model and tenant.

Per (model, tenant), over the window: queries (finished requests), how many the
probe sampled (the measured share), their full context tokens, their effective
context tokens (sampled: mean K_p; unsampled: estimated at the sampled ones'
effective/full ratio, ``kcops.agent.cost.estimate``) with a 95% interval, the cost
at full and at effective context (``cost.prices`` in the agent's config), the
conservative cost (unsampled requests at full context, ``kcops_cost_effective_total``)
and the saving the estimate gives (full − effective). The totals row is the sum of
the rows (its interval the sum of theirs).

A counter's increase over the window is exact (last value − value at the start)
unless the engine restarted inside it (a reset), where Prometheus's
``increase()`` is used. A series first seen inside the window counts from 0
(its counter was born with its first request). The agent keeps
``store.retention_s`` of samples (default 65 minutes): a longer window covers
only what it holds. docs/kc.md ("Effective context and cost").
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

import click

from kcops.agent.cost import Traffic, estimate, sum_sq
from kcops.cli.common import handle_errors, one_line
from kcops.cli.source import Source, source_options

QUERIES = "kcops_request_context_tokens_count"
SAMPLED = "kcops_request_effective_context_tokens_count"
CONTEXT = "kcops_request_context_tokens_sum"
SAMPLED_EFFECTIVE = "kcops_request_effective_context_tokens_sum"
EFFECTIVE = "kcops_request_priced_effective_tokens_total"
COST_FULL = "kcops_cost_full_total"
COST_EFFECTIVE = "kcops_cost_effective_total"
BUCKETS = ("kcops_request_context_tokens_bucket", "kcops_request_effective_context_tokens_bucket")
COLUMNS = (
    "model", "tenant", "queries", "sampled", "context tokens", "effective tokens",
    "effective/full (95%)", "cost full", "cost effective", "conservative", "saving",
)  # fmt: skip


@dataclass
class CostRow:
    """One (model, tenant); ``effective_tokens`` and the costs at effective context are the
    estimate, ``conservative_tokens`` and ``cost_conservative`` price unsampled requests at
    their full context (what ``kcops_cost_effective_total`` counts)."""

    model: str
    tenant: str
    queries: float = 0.0
    sampled: float = 0.0
    context_tokens: float = 0.0
    effective_tokens: float = 0.0
    cost_full: float | None = None  # None: the model has no price
    cost_effective: float | None = None
    effective_tokens_low: float | None = None  # None: no interval (rows built by hand)
    effective_tokens_high: float | None = None
    conservative_tokens: float | None = None
    cost_effective_low: float | None = None
    cost_effective_high: float | None = None
    cost_conservative: float | None = None
    ratio_of: str = ""  # whose sampled requests gave the ratio (kcops.agent.cost.Estimate)

    @property
    def saving(self) -> float | None:
        if self.cost_full is None or self.cost_effective is None:
            return None
        return self.cost_full - self.cost_effective

    @property
    def measured_share(self) -> float | None:
        return self.sampled / self.queries if self.queries else None

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), "saving": self.saving, "measured_share": self.measured_share}


def totals(rows: list[CostRow]) -> CostRow:
    """The sum of the rows; a column that a row may lack (a cost: no price) sums the rows
    that have it (None when none has)."""
    out = CostRow("total", "")
    for f in fields(CostRow):
        if f.name in ("model", "tenant", "ratio_of"):
            continue
        got = [getattr(r, f.name) for r in rows if getattr(r, f.name) is not None]
        setattr(out, f.name, sum(got) if got or getattr(out, f.name) is not None else None)
    return out


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k != "__name__"))


def window_increase(
    client: object, metric: str, start: float, end: float, by: tuple[str, ...] = ("model", "tenant")
) -> dict[tuple[str, ...], float]:
    """The increase of ``metric`` (a selector) over ``start..end``, summed by the labels
    ``by`` over every series: one agent's pod, or every pod a Prometheus scrapes."""
    w = f"{max(1, round(end - start))}s"
    vec = client.vector  # type: ignore[attr-defined]
    last = {_key(m): v for m, v in vec(f"last_over_time({metric}[{w}])", at=end)}
    first = {_key(m): v for m, v in vec(metric, at=start)}
    resets = {_key(m): v for m, v in vec(f"resets({metric}[{w}])", at=end)}
    approx: dict[tuple[tuple[str, str], ...], float] | None = None
    out: dict[tuple[str, ...], float] = {}
    for key, v_end in last.items():
        if resets.get(key, 0.0) > 0:
            if approx is None:
                approx = {_key(m): v for m, v in vec(f"increase({metric}[{w}])", at=end)}
            inc = approx.get(key, 0.0)
        else:
            inc = max(0.0, v_end - first.get(key, 0.0))
        labels = dict(key)
        group = tuple(labels.get(name, "") for name in by)
        out[group] = out.get(group, 0.0) + inc
    return out


def gather(
    client: object, start: float, end: float, sel: Callable[[str], str] = str
) -> list[CostRow]:
    """One row per (model, tenant) seen in the window, sorted by cost then name. ``sel``
    narrows each metric (a source's label selector)."""
    got = {
        name: window_increase(client, sel(name), start, end)
        for name in (QUERIES, SAMPLED, CONTEXT, SAMPLED_EFFECTIVE, EFFECTIVE, COST_FULL)
    }
    conservative = window_increase(client, sel(COST_EFFECTIVE), start, end)
    full_sq, eff_sq = (_sums_sq(client, sel(name), start, end) for name in BUCKETS)
    windows: dict[tuple[str, str], Traffic] = {}
    for mt, v in got[QUERIES].items():
        if v > 0:
            model, tenant = mt
            windows[model, tenant] = Traffic(
                requests=v,
                full=got[CONTEXT].get(mt, 0.0),
                full_sq=full_sq.get(mt, 0.0),
                sampled=got[SAMPLED].get(mt, 0.0),
                effective=got[SAMPLED_EFFECTIVE].get(mt, 0.0),
                effective_sq=eff_sq.get(mt, 0.0),
                priced=got[EFFECTIVE].get(mt, 0.0),
            )
    rows = []
    for (model, tenant), est in estimate(windows).items():
        w = windows[model, tenant]
        row = CostRow(model, tenant, w.requests, w.sampled, w.full, est.tokens)
        row.effective_tokens_low, row.effective_tokens_high = est.low, est.high
        row.conservative_tokens, row.ratio_of = w.priced, est.ratio_of
        row.cost_full = got[COST_FULL].get((model, tenant))
        if row.cost_full is not None:
            # one price per model: a cost is its tokens at the full cost's price per token
            per_token = row.cost_full / w.full if w.full > 0 else 0.0
            row.cost_effective = per_token * est.tokens
            row.cost_effective_low = per_token * est.low
            row.cost_effective_high = per_token * est.high
            row.cost_conservative = conservative.get((model, tenant), per_token * w.priced)
        rows.append(row)
    return sorted(rows, key=lambda r: (-(r.cost_full or 0.0), r.model, r.tenant))


def _sums_sq(client: object, metric: str, start: float, end: float) -> dict[tuple[str, ...], float]:
    """Σx² of a histogram's observations over the window, by (model, tenant), from its
    buckets' increases (``kcops.agent.cost.sum_sq``)."""
    by: dict[tuple[str, ...], dict[float, float]] = {}
    for (model, tenant, le), v in window_increase(
        client, metric, start, end, by=("model", "tenant", "le")
    ).items():
        try:
            by.setdefault((model, tenant), {})[float(le)] = v
        except ValueError:  # not a bucket's bound: not a histogram this code reads
            continue
    return {mt: sum_sq(cumulative) for mt, cumulative in by.items()}


def _cells(r: CostRow) -> list[str]:
    def money(v: float | None) -> str:
        return "—" if v is None else f"{v:.6f}"

    def share(v: float | None) -> str:
        return "—" if v is None or not r.context_tokens else f"{v / r.context_tokens:.3f}"

    saving = r.saving
    pct = f" ({100 * saving / r.cost_full:.0f}%)" if saving is not None and r.cost_full else ""
    measured = f" ({100 * r.measured_share:.0f}%)" if r.measured_share is not None else ""
    ratio = share(r.effective_tokens)
    if (
        r.effective_tokens_low is not None
        and r.effective_tokens_high is not None
        and r.context_tokens
    ):
        ratio += f" ({share(r.effective_tokens_low)}–{share(r.effective_tokens_high)})"
    return [
        one_line(r.model), one_line(r.tenant), f"{r.queries:.0f}", f"{r.sampled:.0f}{measured}",
        f"{r.context_tokens:.0f}", f"{r.effective_tokens:.1f}", ratio, money(r.cost_full),
        money(r.cost_effective), money(r.cost_conservative), money(saving) + pct,
    ]  # fmt: skip


def render_text(rows: list[CostRow]) -> str:
    table = [list(COLUMNS)] + [_cells(r) for r in rows] + [_cells(totals(rows))]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in table
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_html(rows: list[CostRow]) -> str:
    """The same table for ``kcops report``."""
    if not rows:
        return "<h2>Cost by effective context</h2><p>No finished request in the window.</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(r)) + "</tr>"
        for r in [*rows, totals(rows)]
    )
    return (
        "<h2>Cost by effective context</h2><p>Per model and tenant: the requests the probe "
        "sampled (the measured share), cost at full context, at effective context (mean K_p "
        "of the probe's samples; unsampled requests estimated at the sampled ones' "
        "effective/full ratio, with a 95% interval), conservative (unsampled requests at "
        "full context), and the saving a K(C)-sized budget would give (docs/kc.md).</p>"
        f"<table><tr>{head}</tr>{body}</table>"
    )


@click.command(
    "cost",
    help="Queries, context and cost at full and effective context, by model and tenant: of "
    "one agent's pod (--agent), or of every pod a Prometheus scrapes (--prometheus).",
)
@source_options
@click.option("--since", default="24h", show_default=True, help="Window: 30m, 24h, an ISO time.")
@click.option("--json", "as_json", is_flag=True, help="Rows and totals as JSON.")
@handle_errors
def cost_cmd(source: Source, since: str, as_json: bool) -> None:
    from kcops.cli.actions import past_window

    start, end = past_window(since)
    cover = source.coverage(start, end)
    rows = gather(source.client, cover.start, end, source.sel) if cover.start < end else []
    if as_json:
        doc: dict[str, object] = {"start": cover.start, "end": end, "window": cover.as_json()}
        doc["source"] = {"kind": source.kind, "url": source.url, "selector": source.selector}
        doc["rows"] = [r.as_json() for r in rows]
        doc["total"] = totals(rows).as_json()
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(cover.line(source.what))
    if not rows:
        click.echo("no finished request in the window (is the engine the kcops worker or vLLM?)")
        return
    click.echo(render_text(rows))
    if all(r.cost_full is None for r in rows):
        click.echo("no price configured: set cost.prices in the agent's config (docs/kc.md)")


__all__ = [
    "CostRow", "cost_cmd", "gather", "render_html", "render_text", "totals", "window_increase",
]  # fmt: skip
