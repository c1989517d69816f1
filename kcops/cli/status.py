"""``kcops status``: a readable summary of a running agent."""

from __future__ import annotations

import time

import click

from kcops.cli.common import Doc, agent_get_json, agent_option, echo_json, handle_errors, one_line
from kcops.cli.timefmt import ago, duration, local_iso


def format_status(st: Doc, now: float | None = None) -> str:
    now = time.time() if now is None else now
    started = local_iso(now - float(st["uptime_s"]))
    lines = [
        f"kcops agent {st['version']} (pid {st['pid']})",
        f"  uptime   {duration(st['uptime_s'])} (since {started}), "
        f"{st['ticks']} ticks of {st['tick_s']}s",
        f"  series   {st['series']}",
        f"  mode     {st['mode']}",
        f"  engine   {st.get('engine_url') or '(none configured)'}",
    ]
    eng = st.get("engine") or {}
    if eng.get("progress"):
        lines.append(f"  progress {progress_line(eng['state'], eng['progress'])}")
    comps = st.get("components", {})
    collectors = comps.get("collectors", {}).get("collectors", {})
    if collectors:
        lines.append("  collectors:")
        for name, h in sorted(collectors.items()):
            if h["ok"]:
                lines.append(
                    f"    {name}: ok ({h['series']} series, {ago(h.get('last_success'), now)})"
                )
            else:
                lines.append(f"    {name}: unavailable ({h.get('error') or 'not run yet'})")
    for cname, c in sorted(comps.items()):
        if cname == "collectors":
            continue
        health = "ok" if c.get("healthy", False) else "unhealthy"
        detail = c.get("summary") or c.get("error") or ""
        lines.append(f"  {cname}: {health}{(' — ' + detail) if detail else ''}")
    return "\n".join(one_line(line) for line in lines)


def progress_line(state: str, p: Doc) -> str:
    """The stall watch in one line: what it sees, or why it cannot watch."""
    if not p.get("watched", False):
        why = p.get("why") or "no reading yet"
        lacks = p.get("kind_lacks")
        return f"{state}; stall detection off: {lacks or why}"
    stalled = p.get("stalled_s")
    text = f"{state}; {p.get('pending', 0):g} pending, {p['verdict']}"
    if stalled:
        text += f" for {stalled:g}s"
    canary = p.get("canary") or {}
    last = canary.get("last")
    if last:
        text += f"; canary {last['outcome']} in {last['duration_s']:g}s"
    return text


@click.command("status", help="Show a running agent's uptime, collectors and components.")
@agent_option
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON status.")
@handle_errors
def status_cmd(agent_url: str, as_json: bool) -> None:
    st = agent_get_json(agent_url, "/api/v1/status")
    if as_json:
        echo_json(st)
    else:
        click.echo(format_status(st))
