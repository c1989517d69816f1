"""Rich renderables for ``kcops top``: one function per section of the screen.

Each takes a :class:`~kcops.cli.topdata.Snapshot` and fits in 80
columns; ``--once`` prints them in order and the live view puts each in its
own panel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from kcops.cli.timefmt import ago, duration, local_iso
from kcops.cli.topdata import Snapshot

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int | None = None) -> str:
    """One character per value, scaled min..max; a missing value is a space."""
    vals = list(values)[-width:] if width else list(values)
    known = [v for v in vals if v is not None and math.isfinite(v)]
    if not known:
        return " " * len(vals)
    lo, hi = min(known), max(known)
    span = hi - lo
    out = []
    for v in vals:
        if v is None or not math.isfinite(v):
            out.append(" ")
        elif span <= 0:
            out.append(BARS[len(BARS) // 2])
        else:
            out.append(BARS[min(len(BARS) - 1, int((v - lo) / span * len(BARS)))])
    return "".join(out)


def bar(ratio: float | None, width: int = 12) -> Text:
    """``[######      ] 52%``, coloured by level; ``-`` when unknown."""
    if ratio is None:
        return Text("-", style="dim")
    r = min(1.0, max(0.0, ratio))
    filled = round(r * width)
    style = "red" if r >= 0.9 else "yellow" if r >= 0.75 else "green"
    return Text.assemble(
        ("█" * filled, style), ("·" * (width - filled), "dim"), f" {ratio * 100:5.1f}%"
    )


def secs(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def num(v: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if v is None else fmt.format(v)


def gib(v: float | None) -> str:
    return "-" if v is None else f"{v / 2**30:.2f}GiB"


def header(s: Snapshot) -> Text:
    st = s.status
    v = s.values
    up = v.get("engine_up")
    if up is None:
        engine = Text("engine ?", style="dim")
    elif up >= 1:
        engine = Text("engine UP", style="bold green")
    else:
        engine = Text("engine DOWN", style="bold red")
    route = "fallback→base" if (v.get("route_fallback") or 0) >= 1 else "routed"
    return Text.assemble(
        (s.agent_url.split("://", 1)[-1], "bold"),
        f" v{st.get('version', '?')} up {duration(st.get('uptime_s', 0))} {st.get('mode', '?')} ",
        engine,
        f" {route} {local_iso(s.taken_at)[11:19]}",
    )


def serving(s: Snapshot) -> Table:
    v, h = s.values, s.history
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", min_width=8)
    t.add_column(min_width=17)
    t.add_column(style="cyan")
    t.add_row("TTFT", f"p50 {secs(v['ttft_p50'])} p99 {secs(v['ttft_p99'])}",
              sparkline(h.get("ttft_p99", []), 20))  # fmt: skip
    t.add_row("ITL", f"p50 {secs(v['itl_p50'])} p99 {secs(v['itl_p99'])}", "")
    t.add_row("latency", f"p99 {secs(v['latency_p99'])}", sparkline(h.get("latency_p99", []), 20))
    t.add_row(
        "through",
        f"{num(v['rps'], '{:.2f}')} req/s run {num(v['running'], '{:.0f}')} "
        f"wait {num(v['waiting'], '{:.0f}')}",
        sparkline(h.get("rps", []), 20),
    )
    return t


def memory(s: Snapshot) -> Table:
    v, h = s.values, s.history
    used, total = v.get("mem_used"), v.get("mem_total")
    mem_ratio = used / total if used is not None and total else None
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", min_width=8)
    t.add_column(min_width=19)
    t.add_column(style="cyan")
    t.add_row("KV", bar(v["kv_usage"]), sparkline(h.get("kv_usage", []), 20))
    t.add_row("prefix", bar(v["prefix_hit"]), "hit rate (5m)")
    t.add_row("device", bar(mem_ratio), f"{gib(used)} / {gib(total)}")
    t.add_row(
        "top-N",
        f"N={num(v['topn'], '{:.0f}')} shadow {num(v['shadow'], '{:.1%}')}",
        f"attn errors 5m: {num(v['attn_errors'], '{:.0f}')}",
    )
    return t


def kc(s: Snapshot) -> Table:
    v = s.values
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", min_width=8)
    t.add_column()
    t.add_row(
        "K(C)",
        f"p50 {num(v['kc_p50'], '{:.0f}')} tok  κ {num(v['kappa_p50'], '{:.1%}')}  "
        + sparkline(s.history.get("kc_p50", []), 20),
    )
    if s.kc_by_layer:
        vals = [x for _, x in s.kc_by_layer]
        t.add_row("by layer", f"{sparkline(vals, 60)}  max {max(vals):.0f}")
    if s.calls_by_layer:
        vals = [x for _, x in s.calls_by_layer]
        t.add_row("calls/s", f"{sparkline(vals, 60)}  {len(vals)} layers")
    if not s.kc_by_layer and not s.calls_by_layer:
        t.add_row("by layer", Text("no probe data", style="dim"))
    return t


STATE_STYLE = {"firing": "bold red", "pending": "yellow", "inactive": "dim"}


def alert_rows(s: Snapshot) -> list[tuple[str, str, str, str]]:
    """(alertname, state, for how long, value) for active alerts, then a count of the rest."""
    rows = []
    for a in s.alerts:
        since = a.get("fired_at") if a["state"] == "firing" else a.get("active_since")
        span = duration(s.taken_at - since) if since else "-"
        val = a.get("value")
        rows.append((a["alertname"], a["state"], span, "-" if val is None else f"{val:.3g}"))
    return rows


def alerts(s: Snapshot) -> Table:
    t = Table(box=None, padding=(0, 1), show_edge=False, expand=False)
    t.add_column("alert", min_width=26)
    t.add_column("state")
    t.add_column("for")
    t.add_column("value")
    for name, state, span, val in alert_rows(s):
        t.add_row(name, Text(state, style=STATE_STYLE.get(state, "")), span, val)
    active = {a["alertname"] for a in s.alerts}
    quiet = [r["name"] for r in s.rules if r.get("type") == "alerting" and r["name"] not in active]
    t.caption = f"{len(quiet)} other alerts inactive" if s.rules else "no rules loaded"
    return t


def action_line(r: dict[str, object], now: float) -> str:
    ts = r.get("ts")
    when = ago(float(ts), now) if isinstance(ts, (int, float)) else "?"
    kind = r.get("kind")
    if kind == "action":
        ladder = r.get("ladder")
        alert = ladder.get("alertname", "") if isinstance(ladder, dict) else ""
        return f"{when:>9}  {r.get('action', '?')} {r.get('outcome', '?')} {alert}".rstrip()
    if kind == "ladder":
        return f"{when:>9}  ladder {r.get('alertname')} {r.get('event')}"
    return f"{when:>9}  {kind} {r.get('event') or r.get('message') or ''}".rstrip()


def actions(s: Snapshot) -> Text:
    if not s.actions:
        return Text("no actions yet", style="dim")
    return Text("\n".join(action_line(r, s.taken_at) for r in reversed(s.actions)))


def frame(s: Snapshot) -> RenderableType:
    """The whole screen as one renderable (``--once``)."""
    parts: list[RenderableType] = [
        header(s),
        Text("── serving", style="bold blue"),
        serving(s),
        Text("── cache and memory", style="bold blue"),
        memory(s),
        Text("── attention", style="bold blue"),
        kc(s),
        Text("── alerts", style="bold blue"),
        alerts(s),
        Text("── last actions", style="bold blue"),
        actions(s),
    ]
    parts += [Text(f"! {e}", style="red") for e in s.errors]
    return Group(*parts)
