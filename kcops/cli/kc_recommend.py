"""``kcops kc recommend``: the agent's live K(C) budget recommendation, beside the
configured N and (``--sweep DIR``) the offline sweep's; or, with ``--prometheus``, the
fleet's per model (kcops.cli.kc_fleet). No torch: it reads the agent's
``GET /api/v1/kc/recommendation`` or a Prometheus's query API, and the sweep's
recommendation.json."""

from __future__ import annotations

import json
from pathlib import Path

import click

from kcops.cli.common import Doc, agent_request, echo_json, handle_errors, token_headers
from kcops.cli.kc_fleet import interval_text, layer_table
from kcops.cli.source import Source, source_options
from kcops.cli.timefmt import duration
from kcops.errors import ConfigError, KcopsError

ROUTE = "/api/v1/kc/recommendation"


def fetch(agent_url: str, refresh: bool, token_file: str | None = None) -> Doc:
    """The agent's document; ``refresh`` (which needs the token) has it recomputed first."""
    headers = token_headers(token_file) if refresh else None
    path = ROUTE + ("?refresh=1" if refresh else "")
    resp = agent_request("GET", agent_url, path, timeout_s=30, headers=headers)
    if resp.status_code == 401:
        raise KcopsError(
            f"--refresh needs the agent's token (KCOPS_TOKEN or --token-file): {resp.text[:200]}"
        )
    if resp.status_code == 404:
        raise KcopsError(
            f"the agent at {agent_url} has no {ROUTE} (an agent older than the live recommendation)"
        )
    if resp.status_code >= 400:
        raise KcopsError(f"GET {ROUTE}: HTTP {resp.status_code}: {resp.text[:300]}")
    try:
        doc = resp.json()
    except ValueError:
        raise KcopsError(f"GET {ROUTE}: not JSON: {resp.text[:200]}") from None
    if not isinstance(doc, dict):
        raise KcopsError(f"GET {ROUTE}: not a JSON object")
    return doc


def sweep_summary(folder: str) -> Doc:
    """The sweep's recommendation (largest context) and the model it ran on."""
    from kcops.agent.kcrec.calibration import read_sweep

    path = Path(folder)
    if not path.exists():
        raise ConfigError(f"--sweep {folder}: no such folder or file")
    rec = read_sweep(path)
    model = None
    rows = (path if path.is_dir() else path.parent) / "rows.jsonl"
    try:
        model = json.loads(rows.read_text(encoding="utf-8").splitlines()[0])["settings"]["model"]
    except (OSError, ValueError, IndexError, KeyError, TypeError):
        pass
    return {**rec, "model": model, "folder": str(path)}


def _bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def progress_lines(prog: Doc | None) -> list[str]:
    """Too few samples: per layer those there are and needed, and when a first figure comes."""
    if not prog:
        return []
    out = [
        f"  layer {r['layer']}: {r['samples']} of {r['needed']} samples, {r['per_s']:g}/s, "
        + ("enough now" if r["eta_s"] == 0 else "never at this rate (the window drops them)"
           if r["eta_s"] is None else f"enough in {duration(r['eta_s'])}")
        for r in prog["layers"]
    ]  # fmt: skip
    eta = "not at this rate" if prog["eta_s"] is None else f"in {duration(prog['eta_s'])}"
    share, hour = prog.get("sampled_share"), prog.get("share_for_first_within_1h")
    rate = f"; the probe samples {share:.3%} of attention calls" if share is not None else ""
    if hour is not None:
        rate += f", {hour:.3%} would give one within the hour (KCOPS_PROBE_SAMPLE_RATE)"
    return [*out, f"first figure: {eta}{rate}"]


def lines(doc: Doc, sweep: Doc | None) -> list[str]:
    cal = doc["calibration"]
    out = [
        f"Live K(C) budget recommendation, model {doc.get('model') or 'unknown'}: "
        f"K_{doc['p']:g} (the keys holding {doc['p']:.0%} of the attention mass; p from the "
        f"{doc.get('p_source') or 'configuration'}) for "
        f"{doc['quantile']:.1%} of attention calls, over the last {doc['window_s'] / 60:g} min "
        f"({cal['status']}{': ' + cal['source'] if cal['status'] == 'calibrated' else ''})"
    ]
    out += [f"  note: {n}" for n in cal.get("notes", [])]
    out.append(f"status: {doc['status']}" + (f" — {doc['reason']}" if doc.get("reason") else ""))
    out += ["", *layer_table(doc["layers"])]
    uni = doc.get("uniform")
    out.append("")
    if uni:
        over = "all layers" if doc["uniform_over"] == "all" else "the non-dense layers"
        out.append(
            f"uniform N = {uni['tokens']} (interval {interval_text(uni['interval'])}, over {over}; "
            f"binding layer {uni['binding_layer']})"
        )
    else:
        out.append("uniform N: none recommended")
        out += progress_lines(doc.get("progress"))
    conf = doc["configured"]
    if conf.get("top_n") is not None:
        cmp = doc.get("comparison") or {}
        verdict = {
            "below": "BELOW the recommendation: accuracy at risk",
            "above": "more than 4x above it: KV memory wasted",
            "ok": "within [1x, 4x] of it",
        }.get(cmp.get("verdict") or "", "")
        ratio = f" = {cmp['ratio']:g}x the recommendation, {verdict}" if cmp.get("ratio") else ""
        out.append(
            f"configured: top_n {conf['top_n']}, dense layers {conf.get('dense_layers')}, "
            f"route mode {conf.get('route_mode') or 'unknown'} (from {conf['source']}){ratio}"
        )
    else:
        why = conf.get("engine_state_error") or "the engine exports no top-N"
        out.append(f"configured: no top-N budget known (full attention?): {why}")
    if sweep is not None:
        cov = sweep.get("kc_coverage") or {}
        live = str(doc.get("uniform_over"))
        sets = cov.get("by_layers") or {}
        by = (sets.get(live) or {}).get("by_p", {}).get(f"{cov.get('p'):g}")
        if by and live != cov.get("layers"):  # matched over the layers the live N covers
            cov = {**cov, "quantile": by["quantile"], "match": by["match"], "layers": live}
        same = sweep.get("model") in (None, doc.get("model"))
        out.append(
            f"offline sweep ({sweep['folder']}, model {sweep.get('model') or 'unknown'}"
            f"{'' if same else ', NOT the served model'}): context {sweep['context']}: "
            f"{sweep['policy']} N={sweep['n']}"
            + (
                f", K(C) coverage K_{cov['p']:g} at call quantile {cov['quantile']:.3f} "
                f"({cov.get('match')}, {cov.get('layers')} layers)"
                if cov.get("quantile") is not None
                else ", no K(C) coverage recorded (rerun kc sweep)"
            )
        )
    out += ["", *capacity_lines(doc["capacity"], uni["tokens"] if uni else None)]
    return out


def _opt(cap: Doc, key: str, template: str) -> str:
    """``template`` filled with ``cap[key]``, or nothing where that is absent."""
    return template.format(cap[key]) if cap.get(key) is not None else ""


def capacity_lines(cap: Doc, n: int | None) -> list[str]:
    running = cap.get("running_sequences")
    sequences = f"{round(running) if running is not None else 'unknown'} running sequences"
    kind = (
        "WHAT-IF: this engine keeps every key (no top-N path); the figures at N are what "
        "the same memory would hold if it kept only N a layer, not what it serves"
        if cap.get("what_if")
        else "computed"
    )
    out = [
        f"capacity ({kind}; mean context {cap.get('mean_context_tokens') or 'unknown'} tokens "
        f"of the window's sampled calls):",
        f"  KV held now: {_bytes(cap.get('kv_bytes_now'))}"
        + _opt(cap, "kv_usage_ratio_now", ", usage ratio {:.3f}")
        + f", {sequences}"
        + _opt(cap, "kv_share_now", ", {:.3f} of their full-context KV"),
    ]
    if cap.get("kv_tokens_now") is not None:
        out[-1] = (
            f"  KV held now: {cap['kv_tokens_now']} of the cache's {cap['kv_cache_tokens']:.0f} "
            f"tokens (usage ratio {cap['kv_usage_ratio_now']:.3f} x its blocks x block size), "
            f"{sequences}"
        )
    if n is None or cap.get("kv_ratio_at_recommended") is None:
        out.append("  at the recommended budget: unknown (no recommendation or no context lengths)")
        return out
    held = cap.get("kv_bytes_at_recommended")
    out.append(
        f"  at N={n}: {cap['kv_share_at_recommended']:.3f} of full-context KV, "
        f"{cap['kv_ratio_at_recommended']:.3f}x what is held now"
        + (f" = {_bytes(held)}" if held is not None else "")
        + _opt(cap, "kv_usage_ratio_at_recommended", " (usage ratio {:.3f})")
        + _opt(cap, "kv_tokens_at_recommended", ", {} tokens")
    )
    if cap.get("cache_sequences_now") is not None:
        now, at_n = cap["cache_sequences_now"], cap["cache_sequences_at_recommended"]
        out.append(
            f"  the cache holds {now} sequences of the mean context with every key, {at_n} "
            f"with N={n} keys a layer: {at_n - now} more"
        )
    out.append(
        _opt(cap, "kv_bytes_per_token_estimate", "  model KV per token (estimated): {} bytes")
    )
    if cap.get("sequences_at_same_memory") is not None:
        out.append(
            f"  the same memory would hold {cap['sequences_at_same_memory']} concurrent "
            f"sequences: {cap['more_sequences']} more"
        )
    else:
        out.append(
            f"  the same memory would hold {1 / cap['kv_ratio_at_recommended']:.2f}x the sequences"
        )
    return [line for line in out if line]


@click.command(
    "recommend",
    help="The K(C) budget per layer and the uniform N. From one agent (--agent): its live "
    "recommendation beside the configured N and capacity. From a Prometheus (--prometheus): "
    "per model over every pod it scrapes, each pod's own N beside the fleet's.",
)
@source_options
@click.option("--sweep", "sweep_dir", default=None, help="A kc sweep --out folder to compare with.")
@click.option(
    "--refresh", is_flag=True,
    help="Have the agent recompute now, not at its schedule (needs the token).",
)  # fmt: skip
@click.option("--token-file", type=click.Path(dir_okay=False), help="Bearer token file.")
@click.option(
    "--since", default="1h", show_default=True,
    help="With --prometheus: the window the pods' K(C) is counted over (30m, 24h, an ISO time).",
)  # fmt: skip
@click.option(
    "--config", "config_path", default=None, type=click.Path(dir_okay=False),
    help="With --prometheus: an agent config whose recommendation section (quantile, "
    "min_samples, calibration, p) the fleet figure uses; default: the defaults.",
)  # fmt: skip
@click.option(
    "--json", "as_json", is_flag=True, help="Print the document (and the sweep's) as JSON."
)
@handle_errors
def recommend_cmd(
    source: Source,
    sweep_dir: str | None,
    refresh: bool,
    token_file: str | None,
    since: str,
    config_path: str | None,
    as_json: bool,
) -> None:
    sweep = sweep_summary(sweep_dir) if sweep_dir else None
    if source.kind == "prometheus":
        fleet_cmd(source, since, config_path, sweep, as_json)
        return
    if source.selector:
        raise ConfigError("--selector narrows a Prometheus's pods: use it with --prometheus")
    doc = fetch(source.url, refresh, token_file)
    if doc.get("status") == "disabled":
        raise KcopsError(
            f"the agent at {source.url} has the recommendation disabled (recommendation.enabled)"
        )
    if doc.get("status") == "p_mismatch":  # refused, in one line: no figure at a wrong p
        raise KcopsError(f"no recommendation: {doc.get('reason')}")
    if as_json:
        echo_json({"live": doc, "sweep": sweep})
        return
    click.echo("\n".join(lines(doc, sweep)))


def fleet_cmd(
    source: Source, since: str, config_path: str | None, sweep: Doc | None, as_json: bool
) -> None:

    from kcops.agent.config import load_config
    from kcops.cli.actions import past_window
    from kcops.cli.kc_fleet import fleet_recommendation
    from kcops.cli.kc_fleet import lines as fleet_lines
    from kcops.cli.source import Window

    cfg = load_config(config_path).recommendation if config_path else None
    if cfg is None:
        from kcops.agent.config.kcrec import RecommendationSection

        cfg = RecommendationSection()
    start, end = past_window(since)
    doc = fleet_recommendation(source, start, end, cfg)
    refused = [m for m in doc["models"] if m["status"] == "p_mismatch"]
    if refused and len(refused) == len(doc["models"]):
        raise KcopsError(f"no recommendation: {refused[0]['reason']}")
    if as_json:
        echo_json({"fleet": doc, "sweep": sweep})
        return
    w = doc["window"]
    cover = Window(w["asked_start"], w["start"], w["end"])
    click.echo("\n".join(fleet_lines(doc, source.what, cover)))
