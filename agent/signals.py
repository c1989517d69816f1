"""The one catalogue of metric families kcops exports (DESIGN §3).

Every collector writes under these names; the exporter takes type and help
from here. A family is named as Prometheus exposes it: counters end in
``_total`` and histograms are the base name of their ``_bucket``/``_sum``/
``_count`` series.
"""

from __future__ import annotations

from kcops.agent.store import Meta, Store

COUNTER = "counter"
GAUGE = "gauge"
HISTOGRAM = "histogram"

SIGNALS: dict[str, Meta] = {
    # engine-internal, from the probe
    "kcops_attention_calls_total": Meta(COUNTER, "Attention calls seen by the probe, by layer."),
    "kcops_attention_errors_total": Meta(
        COUNTER, "Attention computation errors, by kind (nan, inf, exception)."
    ),
    "kcops_attention_seconds": Meta(HISTOGRAM, "Wall time of sampled attention calls."),
    "kcops_kc_tokens": Meta(HISTOGRAM, "K_p: context tokens that hold mass p (union over heads)."),
    "kcops_kc_ratio": Meta(HISTOGRAM, "kappa = K_p / context length."),
    "kcops_topn_mass_ratio": Meta(HISTOGRAM, "Attention mass held by the top-N keys, by n."),
    "kcops_context_tokens": Meta(HISTOGRAM, "Context length of attention calls."),
    "kcops_probe_dropped_total": Meta(COUNTER, "Probe records dropped instead of blocking."),
    "kcops_probe_frames_total": Meta(COUNTER, "Probe frames received by the agent, by outcome."),
    "kcops_probe_frames_refused_total": Meta(
        COUNTER, "Probe frames the agent refused, by the reason of the decode error's type."
    ),
    "kcops_probe_internal_errors_total": Meta(
        COUNTER, "Failures of the probe's own measuring (never raised into the engine)."
    ),
    "kcops_probe_connections_open": Meta(GAUGE, "Probe stream connections open."),
    "kcops_probe_connections_total": Meta(
        COUNTER, "Probe stream connections, by outcome (accepted, refused, out_of_step)."
    ),
    "kcops_probe_receive_paused_total": Meta(
        COUNTER, "Seconds in which the probe receiver spent its time budget and paused."
    ),
    # engine /metrics, canonical names
    "kcops_request_latency_seconds": Meta(HISTOGRAM, "End-to-end request latency."),
    "kcops_ttft_seconds": Meta(HISTOGRAM, "Time to first token."),
    "kcops_inter_token_latency_seconds": Meta(
        HISTOGRAM, "Time between output tokens (vLLM: inter-token / time-per-output-token)."
    ),
    "kcops_kv_cache_usage_ratio": Meta(GAUGE, "KV cache usage, 0..1."),
    "kcops_kv_cache_bytes": Meta(
        GAUGE, "KV bytes held by running requests (a top-N budget keeps less; lower_topn)."
    ),
    "kcops_requests_waiting": Meta(GAUGE, "Requests waiting to be scheduled."),
    "kcops_requests_running": Meta(GAUGE, "Requests running."),
    "kcops_prefix_cache_queries_total": Meta(COUNTER, "Prefix cache queries (tokens)."),
    "kcops_prefix_cache_hits_total": Meta(COUNTER, "Prefix cache hits (tokens)."),
    "kcops_segment_transfer_seconds": Meta(
        HISTOGRAM, "Time to bring a cached segment's KV back from the Redis tier."
    ),
    "kcops_shadow_agreement_ratio": Meta(
        GAUGE, "Share of shadow-checked tokens where the served path agrees with full attention."
    ),
    "kcops_shadow_checks_total": Meta(COUNTER, "Tokens shadow-checked against full attention."),
    "kcops_attention_topn": Meta(GAUGE, "Current attention budget N of the engine."),
    "kcops_route_fallback": Meta(GAUGE, "1 when the engine routes everything to the base model."),
    # device and process
    "kcops_device_memory_used_bytes": Meta(
        GAUGE, "Device memory used (NVML, or CPU process tree)."
    ),
    "kcops_device_memory_total_bytes": Meta(GAUGE, "Device memory total (or the memory limit)."),
    "kcops_gpu_utilization_ratio": Meta(GAUGE, "GPU utilization, 0..1."),
    "kcops_gpu_temperature_celsius": Meta(GAUGE, "GPU temperature."),
    "kcops_gpu_power_watts": Meta(GAUGE, "GPU power draw."),
    "kcops_gpu_xid_errors_total": Meta(COUNTER, "GPU XID error events, by xid."),
    "kcops_gpu_process_memory_bytes": Meta(GAUGE, "GPU memory used by an engine process."),
    "kcops_process_resident_memory_bytes": Meta(GAUGE, "Resident memory of a process."),
    "kcops_process_cpu_seconds_total": Meta(COUNTER, "CPU time of a process."),
    "kcops_process_threads": Meta(GAUGE, "Threads of a process."),
    "kcops_process_open_fds": Meta(GAUGE, "Open file descriptors of a process."),
    "kcops_process_up": Meta(GAUGE, "1 while the watched process (tree root) is running."),
    "kcops_engine_health_checks_total": Meta(
        COUNTER, "Engine health checks, by outcome (ok, timeout, connect, http_status, ...)."
    ),
    "kcops_engine_up": Meta(GAUGE, "1 when the engine answered its health check this tick."),
    "kcops_engine_state": Meta(
        GAUGE, "1 for the engine's lifecycle state (starting, ready, hung, down), else 0."
    ),
    "kcops_engine_starting_seconds": Meta(
        GAUGE, "How long the engine's current start has lasted; only while starting."
    ),
    "kcops_engine_startup_timeout_seconds": Meta(
        GAUGE, "engine.startup_timeout_s: a start longer than this fires KcopsEngineStartSlow."
    ),
    "kcops_engine_last_healthy_age_seconds": Meta(
        GAUGE, "Seconds since the engine last answered its health check."
    ),
    "kcops_engine_restarts_total": Meta(COUNTER, "Engine restarts seen or made by the agent."),
    "kcops_engine_oom_total": Meta(COUNTER, "Engine exits by out-of-memory."),
    # agent itself
    "kcops_alert_state": Meta(GAUGE, "1 for the current state of each alert (pending, firing)."),
    "ALERTS": Meta(GAUGE, "Prometheus-compatible ALERTS series of the local rule engine."),
    "kcops_action_runs_total": Meta(COUNTER, "Remediation action runs, by action and outcome."),
    "kcops_desired_replicas": Meta(GAUGE, "Replica count the agent asks the HPA for."),
    "kcops_ladder_instances_refused_total": Meta(
        COUNTER, "Firing alert instances not tracked: their ladder holds the most it tracks."
    ),
    "kcops_state_files_set_aside_total": Meta(
        COUNTER, "State files found corrupt or of the wrong shape at start, moved aside."
    ),
    "kcops_audit_torn_repairs_total": Meta(
        COUNTER, "Torn last records of the audit log (a crash mid-write) moved aside at start."
    ),
    "kcops_collector_errors_total": Meta(COUNTER, "Collector failures, by collector and reason."),
    "kcops_collector_up": Meta(GAUGE, "1 when the collector's last run succeeded."),
    "kcops_agent_tick_seconds": Meta(HISTOGRAM, "Duration of one agent tick."),
    "kcops_store_series": Meta(GAUGE, "Series held by the agent's store."),
    "kcops_store_bytes": Meta(GAUGE, "Memory the agent's store has allocated, by its estimate."),
    "kcops_store_max_bytes": Meta(GAUGE, "The store's memory budget (store.max_bytes)."),
    "kcops_store_dropped_samples_total": Meta(
        COUNTER, "Samples the store refused, by reason (max_series, max_bytes, out_of_order)."
    ),
    "kcops_store_evicted_samples_total": Meta(
        COUNTER, "Samples evicted before their retention to stay within store.max_bytes."
    ),
    "kcops_agent_build_info": Meta(GAUGE, "Agent version."),
}


def register_all(store: Store) -> None:
    """Give the store the type and help of every catalogued family."""
    for name, meta in SIGNALS.items():
        store.set_meta(name, meta.type, meta.help)
