"""Rich renderables for ``kcops top``: one function per section of the screen.

Each takes a :class:`~kcops.cli.topdata.Snapshot`. The screen fits 80×24:
serving and cache/memory sit side by side (39 columns each), K(C) takes two
rows, and only active alerts get a row (the inactive ones are counted), so
the last actions keep the rows that are left. ``--once`` prints the same
sections in the same order.
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
SPARK = 10  # sparkline width in the half-width columns
LEFT, RIGHT = 41, 37  # columns of the two side-by-side sections (and 2 between)
# Titles of the screen's sections, in order: the headless test finds each at 80×24.
SECTIONS = ("serving", "cache and memory", "attention", "alerts", "last actions")
ENGINE_STYLE = {"ready": "bold green", "starting": "bold yellow", "stalled": "bold red",
                "hung": "bold red", "down": "bold red"}  # fmt: skip


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


def bar(ratio: float | None, width: int = 10) -> Text:
    """``██████···· 52.0%``, coloured by level; ``-`` when unknown."""
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
    return "-" if v is None else f"{v / 2**30:.2f}"


def engine_text(s: Snapshot) -> Text:
    """The engine's lifecycle state (kcops_engine_state); up/down where only that is known."""
    if s.engine_state is not None:
        return Text(f"engine {s.engine_state}", style=ENGINE_STYLE.get(s.engine_state, "bold"))
    up = s.values.get("engine_up")
    if up is None:
        return Text("engine ?", style="dim")
    return Text("engine answering" if up >= 1 else "engine not answering", style="bold")


def header(s: Snapshot) -> Text:
    st = s.status
    v = s.values
    route = "fallback→base" if (v.get("route_fallback") or 0) >= 1 else "routed"
    return Text.assemble(
        (s.agent_url.split("://", 1)[-1], "bold"),
        f" v{st.get('version', '?')} up {duration(st.get('uptime_s', 0))} {st.get('mode', '?')} ",
        engine_text(s),
        f" {route} {local_iso(s.taken_at)[11:19]}",
    )


def _grid(label_width: int = 7) -> Table:
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", min_width=label_width, no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_column(style="cyan", no_wrap=True)
    return t


def serving(s: Snapshot) -> Table:
    v, h = s.values, s.history
    t = _grid()
    t.add_row("TTFT", f"p50 {secs(v['ttft_p50'])} p99 {secs(v['ttft_p99'])}",
              sparkline(h.get("ttft_p99", []), SPARK))  # fmt: skip
    t.add_row(
        "ITL",
        f"p50 {secs(v['itl_p50'])} p99 {secs(v['itl_p99'])}",
        f"run {num(v['running'], '{:.0f}')} wait {num(v['waiting'], '{:.0f}')}",
    )
    t.add_row(
        "latency", f"p99 {secs(v['latency_p99'])}", sparkline(h.get("latency_p99", []), SPARK)
    )
    t.add_row(
        "through",
        f"{num(v['rps'], '{:.2f}')} req/s {num(v.get('tokens_s'), '{:.1f}')} tok/s",
        sparkline(h.get("rps", []), SPARK),
    )
    return t


def memory(s: Snapshot) -> Table:
    v, h = s.values, s.history
    used, total = v.get("mem_used"), v.get("mem_total")
    mem_ratio = used / total if used is not None and total else None
    t = _grid(6)
    t.add_row("KV", bar(v["kv_usage"]), sparkline(h.get("kv_usage", []), SPARK))
    t.add_row("prefix", bar(v["prefix_hit"]), "hits 5m")
    t.add_row("device", bar(mem_ratio), f"{gib(used)}/{gib(total)}G")
    t.add_row(
        "top-N",
        f"N={num(v['topn'], '{:.0f}')} shadow {num(v['shadow'], '{:.0%}')}",
        f"err {num(v['attn_errors'], '{:.0f}')}",
    )
    return t


def side_by_side(s: Snapshot) -> Table:
    """Serving on the left, cache and memory on the right, each under its title."""
    t = Table.grid(padding=(0, 2))
    t.add_column(width=LEFT, no_wrap=True)
    t.add_column(width=RIGHT, no_wrap=True)
    t.add_row(title(SECTIONS[0]), title(SECTIONS[1]))
    t.add_row(serving(s), memory(s))
    return t


def kc(s: Snapshot) -> Table:
    """K(C) now and per layer: a sparkline across layers, or honestly none."""
    v = s.values
    t = Table.grid(padding=(0, 1))
    t.add_column(style="bold", min_width=7, no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_row(
        "K(C)",
        f"p50 {num(v['kc_p50'], '{:.0f}')} tok  κ {num(v['kappa_p50'], '{:.1%}')}  "
        + sparkline(s.history.get("kc_p50", []), 20),
    )
    calls = [x for _, x in s.calls_by_layer]
    if s.kc_by_layer:
        vals = [x for _, x in s.kc_by_layer]
        t.add_row(
            "layers", f"K(C) p50 {sparkline(vals, 48)} {len(vals)} layers, max {max(vals):.0f}"
        )
    elif calls:
        t.add_row(
            "layers",
            Text.assemble(
                ("no K(C) per layer from this probe; ", "dim"),
                f"calls/s {sparkline(calls, 20)} {len(calls)}",
            ),
        )
    else:
        t.add_row("layers", Text("no probe data", style="dim"))
    return t


STATE_STYLE = {"firing": "bold red", "pending": "yellow", "inactive": "dim"}


def active_alerts(s: Snapshot) -> list[dict[str, object]]:
    """Pending and firing alerts, firing first, then the longest active."""
    rows = [a for a in s.alerts if a.get("state") in ("pending", "firing")]
    rows.sort(key=lambda a: (a["state"] != "firing", _since(a) or s.taken_at))
    return rows


def _since(a: dict[str, object]) -> float | None:
    since = a.get("fired_at") if a.get("state") == "firing" else a.get("active_since")
    return float(since) if isinstance(since, (int, float)) else None


def alert_rows(s: Snapshot) -> list[tuple[str, str, str, str]]:
    """(alertname, state, for how long, value) of each active alert."""
    rows = []
    for a in active_alerts(s):
        since = _since(a)
        span = duration(s.taken_at - since) if since else "-"
        val = a.get("value")
        text = f"{val:.3g}" if isinstance(val, (int, float)) else "-"
        state = str(a["state"])
        if a.get("inhibited_by"):  # firing, but the agent's own doing: not acted on
            state += f", inhibited by {a['inhibited_by']}"
        rows.append((str(a["alertname"]), state, span, text))
    return rows


def inactive_count(s: Snapshot) -> int:
    active = {a["alertname"] for a in active_alerts(s)}
    return sum(1 for r in s.rules if r.get("type") == "alerting" and r["name"] not in active)


def alerts_title(s: Snapshot, hint: str = "") -> str:
    if not s.rules:
        return f"{SECTIONS[3]}: no rules loaded"
    n = len(alert_rows(s))
    return f"{SECTIONS[3]}: {n} active, {inactive_count(s)} inactive{hint}"


def alerts(s: Snapshot) -> Table:
    t = Table(box=None, padding=(0, 1), show_edge=False, show_header=False, expand=False)
    t.add_column("alert", min_width=27, no_wrap=True)
    t.add_column("state", no_wrap=True)
    t.add_column("for", no_wrap=True)
    t.add_column("value", no_wrap=True)
    for name, state, span, val in alert_rows(s):
        style = STATE_STYLE.get(state.split(",")[0], "")
        t.add_row(name, Text(state, style="dim" if "inhibited" in state else style), span, val)
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
    if kind == "escalation":
        return f"{when:>9}  escalation {r.get('alertname')} ({r.get('severity')})"
    return f"{when:>9}  {kind} {r.get('event') or r.get('message') or ''}".rstrip()


def actions(s: Snapshot, limit: int | None = None) -> Text:
    """The audit log's tail, newest first (at most ``limit`` lines)."""
    if not s.actions:
        return Text("no actions yet", style="dim")
    lines = [action_line(r, s.taken_at) for r in reversed(s.actions)]
    return Text("\n".join(lines[:limit] if limit else lines), no_wrap=True, overflow="ellipsis")


def title(name: str) -> Text:
    return Text(f"── {name}", style="bold blue")


def frame(s: Snapshot, actions_shown: int = 6) -> RenderableType:
    """The whole screen as one renderable (``--once``), at most 24 rows at 80 columns."""
    parts: list[RenderableType] = [
        header(s),
        side_by_side(s),
        title(SECTIONS[2]),
        kc(s),
        title(alerts_title(s)),
        alerts(s),
        title(SECTIONS[4]),
        actions(s, actions_shown),
    ]
    parts += [Text(f"! {e}", style="red") for e in s.errors]
    return Group(*parts)
