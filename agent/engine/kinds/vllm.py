"""vLLM (v1 engine): its metrics, admin routes, detection and shutdown drain.

Metrics: names from vllm/v1/metrics/loggers.py; deprecated names are second
choices. vLLM's ``engine`` label (its engine-core index) becomes
``engine_index``, because ``engine`` is ours (the adapter name).

Admin: ``POST /reset_prefix_cache`` resets the whole prefix cache (with
``reset_running_requests=true`` the running requests' blocks too) and answers
200 ``{"success": false}`` when blocks are still in use (vLLM 0.32).
``/pause``, ``/resume`` and ``/is_paused`` exist only with
``VLLM_SERVER_DEV_MODE=1``: probed once. Detected by ``GET /version``.

Shutdown (vLLM 0.32, ``vllm/v1/engine/core.py``, ``_handle_shutdown``): on
SIGTERM the engine core stops admitting, then with ``--shutdown-timeout 0``
(the default) aborts every request in flight at once, and with ``N > 0``
keeps stepping until they are done, for at most ``N`` seconds. So without
``/pause`` a restart loses nothing only with ``N > 0``, and only if whoever
sends SIGTERM waits more than ``N`` seconds before its SIGKILL
(:mod:`kcops.agent.engine.shutdown`). A vLLM killed before it unlinks its
POSIX shared memory leaks ~419 MB of ``psm_*`` segments per kill; the
supervisor reaps them (:mod:`kcops.agent.engine.shm`).
"""

from __future__ import annotations

from collections.abc import Sequence

from kcops.agent.engine.kinds.kind import EngineKind, EvictRoute, PauseRoutes, Routes
from kcops.agent.engine.kinds.metrics import COUNT, COUNTER, GAUGE, HISTOGRAM, Adapter, Map

SHUTDOWN_FLAG = "--shutdown-timeout"
# vLLM's own bound on the flag is an int >= 0; a day is far past any sane drain.
MAX_SHUTDOWN_S = 86_400

VLLM_MAPS = (
    Map("kcops_request_latency_seconds", HISTOGRAM, ("vllm:e2e_request_latency_seconds",)),
    Map("kcops_ttft_seconds", HISTOGRAM, ("vllm:time_to_first_token_seconds",)),
    Map(
        "kcops_inter_token_latency_seconds",
        HISTOGRAM,
        ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    ),
    Map(
        "kcops_kv_cache_usage_ratio",
        GAUGE,
        ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ),
    # What-if capacity (docs/kc.md, "K(C) on vLLM"): its KV cache, in blocks of tokens.
    Map("kcops_kv_cache_blocks", GAUGE, ("vllm:cache_config_info",), value_label="num_gpu_blocks"),
    Map(
        "kcops_kv_cache_block_tokens",
        GAUGE,
        ("vllm:cache_config_info",),
        value_label="block_size",
    ),
    Map("kcops_requests_waiting", GAUGE, ("vllm:num_requests_waiting",)),
    Map("kcops_requests_running", GAUGE, ("vllm:num_requests_running",)),
    Map(
        "kcops_prefix_cache_queries",
        COUNTER,
        ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    ),
    Map(
        "kcops_prefix_cache_hits", COUNTER, ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
    ),
    # Progress (stall detection, kcops.agent.engine.progress): tokens out, prompt tokens
    # in (counted per scheduled chunk, so a chunked prefill moves it every step), and
    # engine steps (one observation of the iteration histogram per step).
    Map("kcops_generation_tokens", COUNTER, ("vllm:generation_tokens",)),
    Map("kcops_prompt_tokens", COUNTER, ("vllm:prompt_tokens",)),
    Map("kcops_engine_iterations", COUNT, ("vllm:iteration_tokens_total",)),
)

ADAPTER = Adapter(
    name="vllm",
    maps=VLLM_MAPS,
    markers=("vllm:",),
    rename_labels={"engine": "engine_index"},
)


def shutdown_timeout_s(argv: Sequence[str]) -> int | None:
    """``N`` of ``--shutdown-timeout N`` (or ``=N``) in one argv; None when absent or not
    a whole number in [0, 86400] (vLLM itself refuses to start with such a value)."""
    value: str | None = None
    for i, arg in enumerate(argv):
        if arg == SHUTDOWN_FLAG and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(SHUTDOWN_FLAG + "="):
            value = arg[len(SHUTDOWN_FLAG) + 1 :]
    if value is None or not value.isdecimal():
        return None
    n = int(value)
    return n if n <= MAX_SHUTDOWN_S else None


KIND = EngineKind(
    adapter=ADAPTER,
    routes=Routes(
        evict=EvictRoute("/reset_prefix_cache", drop_running_param="reset_running_requests"),
        pause=PauseRoutes(
            "/pause", "/resume", probe="/is_paused", pause_params=(("mode", "wait"),)
        ),
    ),
    probe="/version",
    programs=("vllm",),
    sigterm_drain_s=shutdown_timeout_s,
    summary="vLLM (v1 engine)",
)
