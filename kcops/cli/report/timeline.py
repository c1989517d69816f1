"""The data of a report: each panel's series, alert intervals and actions, on one grid.

Read through the agent's own HTTP API: ``/api/v1/query`` at each instant of
the grid (the agent answers PromQL at any ``time`` its store still holds) and
``/api/v1/actions/history`` for the actions. Alert states come from the
``ALERTS`` series the rule engine writes, as Prometheus's do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kcops.cli.common import Doc
from kcops.cli.topdata import HQ, AgentClient

MAX_POINTS = 400


@dataclass(frozen=True)
class Line:
    label: str
    expr: str
    scale: float = 1.0  # e.g. 1000 for seconds shown as ms


@dataclass(frozen=True)
class PlotPanel:
    key: str
    title: str
    unit: str
    lines: tuple[Line, ...]
    ylim: tuple[float, float] | None = None


PANELS: tuple[PlotPanel, ...] = (
    PlotPanel("latency", "Latency", "ms", (
        Line("request p99", HQ.format(q=0.99, m="kcops_request_latency_seconds"), 1000),
        Line("TTFT p99", HQ.format(q=0.99, m="kcops_ttft_seconds"), 1000),
        Line("TTFT p50", HQ.format(q=0.5, m="kcops_ttft_seconds"), 1000),
    )),
    PlotPanel("memory", "Device memory", "% of total", (
        Line("used", "max(kcops_device_memory_used_bytes / kcops_device_memory_total_bytes)", 100),
    ), (0, 100)),
    PlotPanel("kv", "KV cache usage", "%", (
        Line("usage", "max(kcops_kv_cache_usage_ratio)", 100),
    ), (0, 100)),
    PlotPanel("kc", "K(C): context tokens holding 90% of attention", "tokens", (
        Line("p50", HQ.format(q=0.5, m="kcops_kc_tokens")),
        Line("p90", HQ.format(q=0.9, m="kcops_kc_tokens")),
    )),
    PlotPanel("shadow", "Shadow agreement (served path vs full attention)", "%", (
        Line("agreement", "min(kcops_shadow_agreement_ratio)", 100),
    ), (0, 105)),
)  # fmt: skip


@dataclass
class Interval:
    alertname: str
    state: str  # pending | firing
    start: float
    end: float


@dataclass
class Timeline:
    agent_url: str
    times: list[float]
    series: dict[str, dict[str, list[float]]]  # panel key -> line label -> values (NaN = none)
    intervals: list[Interval] = field(default_factory=list)
    actions: list[Doc] = field(default_factory=list)

    @property
    def start(self) -> float:
        return self.times[0]

    @property
    def end(self) -> float:
        return self.times[-1]


def grid(start: float, end: float, step_s: float) -> list[float]:
    if not (math.isfinite(start) and math.isfinite(end) and end > start):
        raise ValueError(f"report window {start}..{end}: end must be after start")
    n = min(MAX_POINTS, int((end - start) / step_s) + 1)
    # Milliseconds, as the range query's parameters travel: the agent steps
    # through the very same instants, so its points key back onto this grid.
    start, step = round(start, 3), round(max(0.001, (end - start) / max(1, n - 1)), 3)
    return [start + i * step for i in range(n)]


def alert_intervals(
    client: AgentClient, times: list[float], step_s: float, expr: str = "ALERTS"
) -> list[Interval]:
    """Runs of consecutive grid points where ``ALERTS`` held (alertname, state)."""
    out: list[Interval] = []
    for labels, pts in client.matrix(expr, times[0], times[-1], step_s):
        name, state = labels.get("alertname", "?"), labels.get("alertstate", "?")
        run: Interval | None = None
        for t in times:
            if round(t, 3) in pts:
                if run is None:
                    run = Interval(name, state, t, t + step_s)
                    out.append(run)
                else:
                    run.end = t + step_s
            else:
                run = None
    out.sort(key=lambda iv: (iv.start, iv.alertname))
    return out


def collect(
    client: AgentClient,
    start: float,
    end: float,
    step_s: float,
    narrow: Callable[[str], str] = str,
    alerts: str = "ALERTS",
) -> Timeline:
    """The panels' series over ``start..end`` (each query narrowed by ``narrow``: a
    source's selector), the alerts and, from an agent, its actions (a Prometheus keeps
    no action history: none)."""
    times = grid(start, end, step_s)
    step = times[1] - times[0] if len(times) > 1 else step_s
    series: dict[str, dict[str, list[float]]] = {}
    for panel in PANELS:
        per_line = series[panel.key] = {}
        for line in panel.lines:
            got = client.matrix(narrow(line.expr), times[0], times[-1], step)
            pts = got[0][1] if got else {}
            per_line[line.label] = [pts.get(round(t, 3), math.nan) * line.scale for t in times]
    hist = client.get("/api/v1/actions/history", {"since": f"{start:.3f}"}) or {}
    actions = [r for r in hist.get("records", []) if r.get("kind") == "action"]
    return Timeline(
        client.url, times, series, alert_intervals(client, times, step, alerts), actions
    )
