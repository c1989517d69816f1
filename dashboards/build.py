"""Grafana dashboards for kcops, built from code so they never drift from the signals.

Each dashboard is a list of panels; each panel is one or more PromQL queries
over the signal names (kcops.agent.signals). ``build_all()`` returns Grafana's
dashboard JSON model keyed by file name; ``kcops dashboards build`` writes them
to ``dashboards/generated/`` (not committed: the JSON is this module's output, which
deploy/'s ConfigMaps carry too), ``kcops dashboards push`` uploads them.

The JSON is made by grafana-foundation-sdk's typed builders (dashboard,
time series and stat panels, Prometheus queries), not written by hand: the
SDK knows the model's field names and nesting, and the ``schemaVersion`` is
the one its types describe. What this module adds is what the SDK cannot
know: the panels below, and the numbers they take from the rules.

Thresholds, query windows and the alert notes in panel descriptions are not
copied from the rules: a panel names the rule parameter
(``threshold="device_memory_ratio"``, ``[${rate_window}]`` in a query,
``${cache_hit_ratio}`` in its text) and the alert it shows, and
:func:`build_all` reads them from the loaded rule set, so a parameter
overridden for the rules moves the panel's line and window with it. Rates use
``rate_window``, the attention-error count ``attention_errors_window`` (as
their alerts do), and the hour-long counts no rule names use
``baseline_window``, the longest window the rules look back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grafana_foundation_sdk.builders import dashboard as grafana
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, ThresholdsMode, VariableRefresh
from grafana_foundation_sdk.models.dashboard import Threshold as Step

from kcops.agent.duration import format_duration
from kcops.agent.rules.rulefile import known_names, substitute

if TYPE_CHECKING:
    from kcops.agent.rules.loader import RuleSet

# Every panel and query reads the data source the dashboard's picker chose.
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")
# Every query is scoped to the chosen pod(s); `instance` is what Prometheus adds.
SEL = 'instance=~"$instance"'


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


class Panel:
    """One panel: its title and queries. ``${param}`` in the title, the description
    and the queries is replaced by the rule parameter's value; ``threshold`` (a red
    line) is a number or the name of the rule parameter holding it; ``alert`` names
    the rule this panel watches (its `for` joins the description)."""

    def __init__(
        self,
        title: str,
        *queries: Query,
        unit: str = "short",
        kind: type[timeseries.Panel] | type[stat.Panel] = timeseries.Panel,
        description: str = "",
        threshold: float | str | None = None,
        alert: str | None = None,
        width: int = 12,
        height: int = 8,
    ) -> None:
        self.title, self.queries, self.unit, self.kind = title, queries, unit, kind
        self.description, self.threshold, self.alert = description, threshold, alert
        self.width, self.height = width, height


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    tags: tuple[str, ...] = field(default=("kcops",))


def q(expr: str, legend: str = "") -> Query:
    return Query(expr.replace("$SEL", SEL), legend)


def _quantile(phi: float, metric: str, by: str = "le") -> str:
    """The ``phi`` quantile of a histogram over the rules' rate window."""
    rate = f"rate({metric}_bucket{{$SEL}}[${{rate_window}}])"
    return f"histogram_quantile({phi}, sum by ({by}) ({rate}))"


def _p99(metric: str) -> str:
    return _quantile(0.99, metric)


SERVING = Dashboard(
    uid="kcops-serving",
    title="kcops / serving",
    description="Latency, KV cache, prefix cache and memory of the engine kcops watches.",
    panels=(
        Panel(
            "Time to first token p99",
            q(_p99("kcops_ttft_seconds"), "TTFT p99"),
            unit="s",
            threshold="p99_ttft_seconds",
            description="p99 time to first token above ${p99_ttft_seconds}s.",
            alert="KcopsP99LatencyHigh",
        ),
        Panel(
            "Inter-token latency p99",
            q(_p99("kcops_inter_token_latency_seconds"), "inter-token p99"),
            unit="s",
            threshold="p99_inter_token_seconds",
            description="p99 gap between streamed tokens above ${p99_inter_token_seconds}s.",
            alert="KcopsInterTokenLatencyHigh",
        ),
        Panel(
            "Request latency p99 (whole request)",
            q(_p99("kcops_request_latency_seconds"), "p99"),
            unit="s",
            description="End to end, every decoded token included: it grows with the answer's "
            "length, so no alert watches it; TTFT and inter-token latency do.",
        ),
        Panel(
            "Requests",
            q("sum(kcops_requests_running{$SEL})", "running"),
            q("sum(kcops_requests_waiting{$SEL})", "waiting"),
        ),
        Panel(
            "KV cache usage",
            q("max by (instance) (kcops_kv_cache_usage_ratio{$SEL})", "{{instance}}"),
            unit="percentunit",
        ),
        Panel(
            "Prefix cache hit rate",
            q(
                "sum(rate(kcops_prefix_cache_hits_total{$SEL}[${rate_window}]))"
                " / sum(rate(kcops_prefix_cache_queries_total{$SEL}[${rate_window}]))",
                "hit rate",
            ),
            unit="percentunit",
            threshold="cache_hit_ratio",
            description="Hit rate below ${cache_hit_ratio}.",
            alert="KcopsPrefixCacheHitRateLow",
        ),
        Panel(
            "Device memory used",
            q(
                "kcops_device_memory_used_bytes{$SEL} / kcops_device_memory_total_bytes{$SEL}",
                "{{instance}} {{device}}",
            ),
            unit="percentunit",
            threshold="device_memory_ratio",
            description="Used share above ${device_memory_ratio}.",
            alert="KcopsDeviceMemoryHigh",
        ),
        Panel(
            "Segment transfer p99 (Redis KV tier)",
            q(_p99("kcops_segment_transfer_seconds"), "p99"),
            unit="s",
            threshold="segment_transfer_p99_seconds",
            description="p99 above ${segment_transfer_p99_seconds}s.",
            alert="KcopsSegmentTransferSlow",
        ),
        Panel(
            "Engine state",
            q("max by (state) (kcops_engine_state{$SEL})", "{{state}}"),
            description="starting -> ready -> stalled/hung/down. Engine down is paged only once "
            "the engine has been ready.",
            alert="KcopsEngineDown",
            width=6,
        ),
        Panel(
            "Engine start time",
            q("max(kcops_engine_starting_seconds{$SEL})", "starting for"),
            q("max(kcops_engine_startup_timeout_seconds{$SEL})", "timeout"),
            unit="s",
            alert="KcopsEngineStartSlow",
            width=6,
        ),
        Panel(
            "Engine stall: work pending without progress",
            q("max(kcops_engine_stalled_seconds{$SEL})", "stalled for"),
            q("max(kcops_engine_pending_requests{$SEL})", "pending requests"),
            description="Seconds pending work has seen no token, step or attention call (absent "
            "while idle); stalled once past engine.stall_after_s with a failed canary.",
            alert="KcopsEngineStalled",
            width=6,
        ),
        Panel(
            "Engine canary",
            q("min(kcops_engine_canary_success{$SEL})", "success"),
            q("max(kcops_engine_canary_duration_seconds{$SEL})", "duration (s)"),
            description="The last one-token completion the agent sent: 1 answered, 0 failed.",
            width=6,
        ),
        Panel(
            "Engine restarts / OOM (${baseline_window})",
            q("sum(increase(kcops_engine_restarts_total{$SEL}[${baseline_window}]))", "restarts"),
            q("sum(increase(kcops_engine_oom_total{$SEL}[${baseline_window}]))", "OOM"),
            kind=stat.Panel,
            width=6,
        ),
    ),
)

ATTENTION = Dashboard(
    uid="kcops-attention",
    title="kcops / attention and K(C)",
    description="What the in-engine probe sees: K(C), top-N mass, errors, attention time.",
    panels=(
        Panel(
            "K(C): context tokens that hold mass p",
            q(_quantile(0.5, "kcops_kc_tokens"), "median"),
            q(_quantile(0.9, "kcops_kc_tokens"), "p90"),
            description="Mean K(C) at ${kc_surge_ratio} x its baseline or more.",
            alert="KcopsKCSurge",
        ),
        Panel(
            "kappa = K / context", q(_quantile(0.5, "kcops_kc_ratio"), "median"), unit="percentunit"
        ),
        Panel(
            "Attention mass held by the top-N keys (median)",
            q(_quantile(0.5, "kcops_topn_mass_ratio", "le, n"), "N={{n}}"),
            unit="percentunit",
        ),
        Panel(
            "Shadow agreement (served vs full attention)",
            q("min(kcops_shadow_agreement_ratio{$SEL})", "agreement"),
            unit="percentunit",
            description="Agreement down more than ${accuracy_drop_ratio} from its baseline.",
            alert="KcopsAccuracyDrop",
        ),
        Panel(
            "Attention errors",
            q(
                "sum by (kind) (increase(kcops_attention_errors_total{$SEL}"
                "[${attention_errors_window}]))",
                "{{kind}}",
            ),
            threshold=1,
            description="Any NaN/Inf or other attention error within ${attention_errors_window}.",
            alert="KcopsAttentionErrors",
        ),
        Panel(
            "Attention calls per second by layer",
            q(
                "sum by (layer) (rate(kcops_attention_calls_total{$SEL}[${rate_window}]))",
                "layer {{layer}}",
            ),
            unit="ops",
        ),
        Panel(
            "Attention call time p99 (sampled)", q(_p99("kcops_attention_seconds"), "p99"), unit="s"
        ),
        Panel(
            "Context length p50 / p99",
            q(_quantile(0.5, "kcops_context_tokens"), "p50"),
            q(_quantile(0.99, "kcops_context_tokens"), "p99"),
        ),
        Panel(
            "Attention budget N and route",
            q("max(kcops_attention_topn{$SEL})", "N"),
            q("max(kcops_route_fallback{$SEL})", "fallback"),
        ),
        Panel(
            "Attention budget: configured N vs live K(C) recommendation",
            q("max(kcops_attention_topn{$SEL})", "configured N"),
            q("max(kcops_kc_recommended_n{$SEL})", "recommended N"),
            q("max by (layer) (kcops_kc_recommended_tokens{$SEL})", "layer {{layer}}"),
            description="The live recommendation (docs/kc.md): per layer, the tokens that "
            "hold the probe's mass p for the chosen share of calls over the last hour; "
            "absent while too few samples. Above ${budget_over_ratio}x or below it: "
            "KcopsBudgetMismatch.",
            alert="KcopsBudgetMismatch",
        ),
        Panel(
            "KV at the recommended N (computed)",
            q("max(kcops_kc_recommended_kv_ratio{$SEL})", "KV vs now"),
            q("max(kcops_kc_recommended_more_sequences{$SEL})", "more sequences"),
            description="What the current load's KV would be at the recommended N, as a share "
            "of what it holds now, and how many more concurrent sequences that memory would "
            "fit: an estimate from the window's context lengths, not a measurement.",
        ),
        Panel(
            "Probe records dropped",
            q("sum(rate(kcops_probe_dropped_total{$SEL}[${rate_window}]))", "dropped/s"),
            unit="ops",
        ),
        Panel(
            "Cost at full vs effective context, by tenant (${baseline_window})",
            q(
                "sum by (tenant) (increase(kcops_cost_full_total{$SEL}[${baseline_window}]))",
                "{{tenant}} full",
            ),
            q(
                "sum by (tenant) (increase(kcops_cost_effective_total{$SEL}[${baseline_window}]))",
                "{{tenant}} effective",
            ),
            description="Finished requests priced (cost.prices) at their full context and at "
            "their effective context (mean K_p; unsampled requests at full). The gap is the "
            "saving a K(C)-sized budget would give. kcops cost prints the table.",
        ),
        Panel(
            "Context per request: full vs effective (mean over ${baseline_window})",
            q(
                "sum by (tenant) (increase(kcops_request_context_tokens_sum{$SEL}"
                "[${baseline_window}])) / sum by (tenant) "
                "(increase(kcops_request_context_tokens_count{$SEL}[${baseline_window}]))",
                "{{tenant}} full",
            ),
            q(
                "sum by (tenant) (increase(kcops_request_effective_context_tokens_sum{$SEL}"
                "[${baseline_window}])) / sum by (tenant) "
                "(increase(kcops_request_effective_context_tokens_count{$SEL}"
                "[${baseline_window}]))",
                "{{tenant}} effective",
            ),
            description="Mean full context (prompt + generated) of finished requests, and "
            "mean effective context of those the probe sampled.",
        ),
    ),
)

AGENT = Dashboard(
    uid="kcops-agent",
    title="kcops / agent and remediation",
    description="Alert states, remediation runs and the agent's own health.",
    panels=(
        Panel(
            "Alerts firing",
            q('sum by (alertname) (kcops_alert_state{$SEL, state="firing"})', "{{alertname}}"),
        ),
        Panel(
            "Remediation runs (${baseline_window})",
            q(
                "sum by (action, outcome) "
                "(increase(kcops_action_runs_total{$SEL}[${baseline_window}]))",
                "{{action}} {{outcome}}",
            ),
        ),
        Panel("Desired replicas (for the HPA)", q("max(kcops_desired_replicas{$SEL})", "desired")),
        Panel(
            "Collector errors",
            q(
                "sum by (collector, reason) "
                "(rate(kcops_collector_errors_total{$SEL}[${rate_window}]))",
                "{{collector}} {{reason}}",
            ),
            unit="ops",
        ),
        Panel("Agent tick p99", q(_p99("kcops_agent_tick_seconds"), "p99"), unit="s"),
        Panel(
            "Agent resident memory",
            q('kcops_process_resident_memory_bytes{$SEL, process="agent"}', "{{instance}}"),
            unit="bytes",
        ),
    ),
)

# The fleet: every pod the Prometheus scrapes, read from the recording rules of
# alerts/records.yaml (evaluated by that Prometheus, never by an agent), so a panel is one
# cheap series per model and tenant instead of every pod's raw histograms. The Pod
# variable does not apply: the records are summed over pods.
FLEET = Dashboard(
    uid="kcops-fleet",
    title="kcops / fleet",
    description="Cost, context and K(C) over every pod, from the fleet recording rules "
    "(alerts/records.yaml: the PrometheusRule carries them).",
    panels=(
        Panel(
            "Cost per hour at full vs effective context, by model and tenant",
            q("3600 * model_tenant:kcops_cost_full:rate5m", "{{model}} {{tenant}} full"),
            q("3600 * model_tenant:kcops_cost_effective:rate5m", "{{model}} {{tenant}} effective"),
            description="Priced as cost.prices in each agent's config, summed over pods. "
            "kcops cost --prometheus prints the table for any window.",
        ),
        Panel(
            "Requests per second, by model and tenant",
            q("model_tenant:kcops_requests:rate5m", "{{model}} {{tenant}}"),
            unit="reqps",
        ),
        Panel(
            "Context per request: full vs effective (5m means)",
            q("model_tenant:kcops_request_context_tokens:mean5m", "{{model}} {{tenant}} full"),
            q(
                "model_tenant:kcops_request_effective_context_tokens:mean5m",
                "{{model}} {{tenant}} effective",
            ),
        ),
        Panel(
            "K(C) p95 by layer, every pod's sampled calls",
            q("engine_layer:kcops_kc_tokens:p95_5m", "{{engine}} layer {{layer}}"),
            description="The 0.95 quantile of K_p over 5m (uncalibrated). The budget to run: "
            "kcops kc recommend --prometheus, with the calibration and each pod's own N.",
        ),
        Panel(
            "K(C) samples per second by layer",
            q("engine_layer:kcops_kc_tokens_samples:rate5m", "{{engine}} layer {{layer}}"),
            unit="ops",
        ),
    ),
)

DASHBOARDS = (SERVING, ATTENTION, AGENT, FLEET)


def _param(params: Mapping[str, int | float | str], name: str, panel: str) -> int | float | str:
    if name not in params:
        known = known_names(params)
        raise ValueError(f"panel {panel!r}: unknown rule parameter {name!r} (known: {known})")
    return params[name]


def _text(text: str, params: Mapping[str, int | float | str], panel: str) -> str:
    """``text`` with each ``${param}`` replaced as the rule loader replaces it."""
    try:
        return substitute(text, params)
    except ValueError as exc:
        raise ValueError(f"panel {panel!r}: {exc}") from None


def _threshold(t: float | str, params: Mapping[str, int | float | str], panel: str) -> float:
    value = _param(params, t, panel) if isinstance(t, str) else t
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"panel {panel!r}: threshold {t!r} is {value!r}, not a number") from None


def _description(p: Panel, ruleset: RuleSet) -> str:
    text = _text(p.description, ruleset.params, p.title)
    rule = ruleset.get(p.alert) if p.alert else None
    if rule is None or rule.kind != "alerting":
        return text
    for_s = getattr(rule, "for_s", 0.0)
    when = f"after {format_duration(for_s)}" if for_s else "at once"
    return f"{text} Alert {rule.name} fires {when}.".strip()


def _panel(p: Panel, pid: int, ruleset: RuleSet) -> timeseries.Panel | stat.Panel:
    """One panel's builder, its numbers and windows read from ``ruleset``."""
    params = ruleset.params
    # Green from -Infinity (Grafana writes it as null), then each rule's line.
    steps = [Step(None, "green")]
    if p.threshold is not None:
        steps.append(Step(_threshold(p.threshold, params, p.title), "red"))
    panel = (
        p.kind()
        .id(pid)
        .title(_text(p.title, params, p.title))
        .description(_description(p, ruleset))
        .datasource(DS)
        .span(p.width)
        .height(p.height)
        .unit(p.unit)
        .thresholds(grafana.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
    )
    for i, t in enumerate(p.queries):
        panel.with_target(
            prometheus.Dataquery()
            .ref_id(chr(ord("A") + i))
            .datasource(DS)
            .expr(_text(t.expr, params, p.title))
            .legend_format(t.legend)
        )
    return panel


def dashboard_json(d: Dashboard, ruleset: RuleSet) -> dict[str, object]:
    """Grafana's dashboard JSON model for one dashboard.

    Panels flow left to right; the SDK starts a new row once a row's widths
    reach the grid's 24 columns, and does not move down a panel wider than
    what is left of its row (the layout test catches one). Thresholds and
    alert notes come from ``ruleset`` (its params, its rules' ``for``); a panel
    naming an unknown parameter raises ValueError.
    """
    board = (
        grafana.Dashboard(d.title)
        .uid(d.uid)
        .description(d.description)
        .tags(list(d.tags))
        .editable()
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("browser")
        # A list, though empty (the SDK alone writes `{}`): Grafana adds its built-in
        # annotation to it.
        .annotations([])
        .with_variable(
            grafana.DatasourceVariable("datasource").label("Data source").type("prometheus")
        )
        .with_variable(
            grafana.QueryVariable("instance")
            .label("Pod")
            .datasource(DS)
            .query("label_values(kcops_agent_build_info, instance)")
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        )
    )
    for pid, p in enumerate(d.panels, start=1):
        board.with_panel(_panel(p, pid, ruleset))
    model: dict[str, object] = json.loads(JSONEncoder().encode(board.build()))
    return model


def build_all(ruleset: RuleSet | None = None) -> dict[str, dict[str, object]]:
    """File name -> dashboard JSON, for every kcops dashboard.

    ``ruleset`` gives thresholds and alert notes; default: the packaged
    ``alerts/rules.yaml`` with its default params.
    """
    if ruleset is None:
        from kcops.agent.rules.loader import default_rules_path, load_rules

        ruleset = load_rules(default_rules_path())
    return {f"{d.uid}.json": dashboard_json(d, ruleset) for d in DASHBOARDS}
