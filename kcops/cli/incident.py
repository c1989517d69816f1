"""``kcops incident list|show|export``: the evidence the agent kept when it paged
(docs/incidents.md). :func:`summary` turns one record into what on-call reads first."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import click

from kcops.cli.common import (
    Doc,
    agent_option,
    agent_request,
    echo_json,
    handle_errors,
    one_line,
    token_headers,
)
from kcops.cli.timefmt import as_float, local_iso, when
from kcops.errors import ConfigError, KcopsError, Unreachable

if TYPE_CHECKING:
    import httpx

API = "/api/v1/incidents"
HOT_FRAMES = 5  # innermost frames shown per thread
OUTPUT_LINES = 20
IDS_NAMED = 10  # ids an unknown-id error lists
# Innermost Python frames of a thread that is only waiting for work: a thread idle in one
# is left out of the summary unless it runs or holds the GIL (the JSON keeps every thread).
IDLE_WAITS = frozenset({
    "wait", "_wait_for_tstate_lock", "select", "poll", "epoll_wait", "accept", "recv",
    "recv_into", "readinto", "readline", "get", "_recv", "_recv_bytes", "_poll", "sleep",
})  # fmt: skip


def headers_or_fail(token_file: str | None) -> dict[str, str]:
    headers = token_headers(token_file)
    if not headers:
        raise ConfigError("no token: the incident API needs KCOPS_TOKEN or --token-file")
    return headers


def _error(resp: httpx.Response) -> str:
    try:
        body = resp.json()
    except ValueError:
        return one_line(resp.text[:200])
    return one_line(body.get("error") if isinstance(body, dict) else body)[:300]


def _check(
    resp: httpx.Response, agent_url: str, headers: dict[str, str], incident_id: str | None = None
) -> None:
    """Raise the one-line error of an answer that is not 200; an unknown id names those
    the agent keeps."""
    code = resp.status_code
    if code == 200:
        return
    if code == 401:
        raise KcopsError(f"the agent at {agent_url} refused the token (401): {_error(resp)}")
    if code == 400 and incident_id is not None:
        raise KcopsError(f"{_error(resp)} (`kcops incident list`)")
    if code == 404 and incident_id is not None:
        ids = [str(i.get("id")) for i in fetch_list(agent_url, headers)[:IDS_NAMED]]
        known = f"it keeps {', '.join(ids)}" if ids else "it keeps none"
        raise KcopsError(
            f"no incident {one_line(incident_id)!r} on the agent at {agent_url}; {known} "
            "(`kcops incident list`)"
        )
    if code == 404:
        raise KcopsError(f"the agent at {agent_url} has no incident API (an older kcops)")
    raise KcopsError(f"{resp.request.url.path}: HTTP {code}: {_error(resp)}")


def _path(incident_id: str, tail: str = "") -> str:
    return f"{API}/{quote(incident_id, safe='')}{tail}"  # an id can reach no other route


def fetch_list(agent_url: str, headers: dict[str, str]) -> list[Doc]:
    """The manifests the agent keeps, newest first."""
    resp = agent_request("GET", agent_url, API, headers=headers, timeout_s=30.0)
    _check(resp, agent_url, headers)
    return list(resp.json().get("incidents", []))


def fetch_record(agent_url: str, incident_id: str, headers: dict[str, str]) -> Doc:
    """One incident's manifest with its processes, output lines and series size."""
    resp = agent_request("GET", agent_url, _path(incident_id), headers=headers, timeout_s=30.0)
    _check(resp, agent_url, headers, incident_id)
    doc: Doc = resp.json()
    return doc


# -- the summary -----------------------------------------------------------------------


def _capture(rec: Doc) -> str:
    cap = rec.get("capture")
    if not cap:
        return "not taken (yet)"
    state = "complete" if cap.get("complete") else "incomplete"
    return f"{cap.get('seconds', 0):.2f}s of a {cap.get('budget_s', 0):g}s budget, {state}"


def _missing(rec: Doc) -> list[str] | None:
    """What the capture could not take; None before it ran."""
    cap = rec.get("capture")
    return [str(m) for m in cap.get("missing") or []] if cap else None


def _alerts(rec: Doc) -> str:
    def one(a: Doc) -> str:
        by = f" by {a['inhibited_by']}" if a.get("inhibited_by") else ""
        return f"{a.get('alertname')} ({a.get('state')}{by})"

    return ", ".join(one(a) for a in rec.get("alerts") or []) or "-"


def _frame(f: Doc) -> str:
    return f"{f.get('name') or '?'} ({f.get('file') or '?'}:{f.get('line') or '?'})"


def _python(frames: list[Doc]) -> list[Doc]:
    """The Python frames, innermost first; the native ones when there are none (``--native``
    dumps interleave libc's and the interpreter's C frames; the JSON keeps them all)."""
    py = [f for f in frames if str(f.get("file") or "").endswith(".py")
          or str(f.get("file") or "").startswith("<")]  # fmt: skip
    return py or frames


def _is_main(proc: Doc, thread: Doc) -> bool:
    return thread.get("name") == "MainThread" or thread.get("thread_id") == proc.get("pid")


def _threads(proc: Doc) -> list[Doc]:
    return list((proc.get("stacks") or {}).get("threads") or [])


def _hot(proc: Doc, thread: Doc) -> bool:
    frames = _python(thread.get("frames") or [])
    idle = bool(frames) and frames[0].get("name") in IDLE_WAITS
    return (
        _is_main(proc, thread) or bool(thread.get("active") or thread.get("owns_gil")) or not idle
    )


def where_hung(rec: Doc) -> str | None:
    """One line: the main thread's innermost frame in the first process whose main thread
    is not idle in a wait (a vLLM API server's event loop is), else the first with stacks."""
    found = []
    for proc in rec.get("processes") or []:
        threads = [t for t in _threads(proc) if t.get("frames")]
        if threads:
            main = next((t for t in threads if _is_main(proc, t)), threads[0])
            found.append((proc, _python(main["frames"])[0]))
    if not found:
        return None
    busy = [(p, f) for p, f in found if f.get("name") not in IDLE_WAITS]
    proc, frame = (busy or found)[0]
    return one_line(f"{proc.get('role')} (pid {proc.get('pid')}): {_frame(frame)}")


def _process_lines(proc: Doc) -> list[str]:
    state = f"{proc.get('state') or '?'} {proc.get('state_words') or ''}".rstrip()
    if proc.get("frozen"):
        state += ", frozen"
    rss = proc.get("rss_bytes")
    lines = [
        f"  pid {proc.get('pid')} {proc.get('role')}: {state}, wchan {proc.get('wchan') or '-'}, "
        f"{proc.get('threads', '?')} threads, RSS "
        f"{'?' if rss is None else f'{rss / 2**20:.0f} MiB'}, CPU {proc.get('cpu_s', '?')} s",
        f"    {proc.get('cmdline') or ''}"[:200],
    ]
    stacks = proc.get("stacks") or {}
    threads = _threads(proc)
    shown = [t for t in threads if _hot(proc, t)]
    for t in shown:
        flags = ", ".join(f for f, on in (("active", t.get("active")),
                                          ("owns the GIL", t.get("owns_gil"))) if on)  # fmt: skip
        what = "where it hung" if _is_main(proc, t) else "thread"
        name = f"{t.get('thread_id')} {t.get('name') or ''}".rstrip()
        lines.append(f"    {what} ({name}{', ' + flags if flags else ''}):")
        lines += [f"      {_frame(f)}" for f in _python(t.get("frames") or [])[:HOT_FRAMES]]
    if len(threads) > len(shown):
        lines.append(f"    ({len(threads) - len(shown)} more thread(s) idle in a wait)")
    if stacks.get("error"):
        lines.append(f"    stack error: {stacks['error']}")
    elif not threads:
        lines.append("    no stacks")
    return lines


def _timeline_lines(rec: Doc) -> list[str]:
    t0 = as_float(rec.get("opened_at")) or 0.0
    out = []
    for e in rec.get("timeline") or []:
        t = as_float(e.get("t"))
        rel = "?" if t is None else f"{t - t0:+.1f}s"
        out.append(f"  {rel:>8}  {e.get('kind', '?'):<8} {e.get('what', '')}")
    return out or ["  (empty)"]


def summary(record: Doc) -> str:
    """What on-call reads first of a record (``GET /api/v1/incidents/ID``): each process
    and its hottest frames, the engine's last output, the timeline, what capture missed.
    Every line is printable (:func:`one_line`): the engine wrote much of it."""
    rec = record
    head = [
        f"incident {rec.get('id')}: {rec.get('status')}, opened by {rec.get('trigger')}",
        f"opened {when(as_float(rec.get('opened_at')))}, closed "
        f"{local_iso(as_float(rec.get('closed_at')))}",
        f"alerts: {_alerts(rec)}",
        f"capture: {_capture(rec)}",
    ]
    if rec.get("why_incomplete"):
        head.append(f"incomplete: {rec['why_incomplete']}")
    lines = [*head, "", "processes (stacks taken before any signal was sent):"]
    for proc in rec.get("processes") or []:
        lines += _process_lines(proc)
    if not rec.get("processes"):
        lines.append("  (none captured)")
    output = [str(x) for x in rec.get("output") or []]
    lines += ["", f"engine's last output ({min(len(output), OUTPUT_LINES)} of {len(output)}):"]
    lines += [f"  {x}" for x in output[-OUTPUT_LINES:]] or ["  (none)"]
    lines += ["", "timeline (seconds from opening):", *_timeline_lines(rec)]
    missing = _missing(rec)
    lines += [
        "",
        f"capture missed: {'; '.join(missing or ['nothing']) if missing is not None else '-'}",
    ]
    return "\n".join(one_line(x) for x in lines)


# -- the commands ----------------------------------------------------------------------

token_option = click.option(
    "--token-file", type=click.Path(dir_okay=False), help="Bearer token file (else $KCOPS_TOKEN)."
)


@click.group("incident", help="Incident records: what the agent captured when it paged.")
def incident_group() -> None:
    pass


@incident_group.command("list", help="The incidents the agent keeps, newest first.")
@agent_option
@token_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@handle_errors
def list_cmd(agent_url: str, token_file: str | None, as_json: bool) -> None:
    got = fetch_list(agent_url, headers_or_fail(token_file))
    if as_json:
        echo_json({"incidents": got})
        return
    if not got:
        click.echo("no incidents")
        return
    click.echo(f"{'id':<22} {'opened':<25} {'status':<10} {'trigger':<24} {'alerts':<6} capture")
    for r in got:
        opened = local_iso(as_float(r.get("opened_at")))
        missing = _missing(r)
        cap = "complete" if missing == [] else "-" if missing is None else "missing: "
        cap += "; ".join(missing or [])
        line = (
            f"{r.get('id', '?'):<22} {opened:<25} {r.get('status', '?'):<10} "
            f"{r.get('trigger', '?'):<24} {len(r.get('alerts') or []):<6} {cap}"
        )
        click.echo(one_line(line))


@incident_group.command("show", help="One incident: processes, hottest frames, output, timeline.")
@click.argument("incident_id", metavar="ID")
@agent_option
@token_option
@click.option("--json", "as_json", is_flag=True, help="Print the record as the API answers it.")
@handle_errors
def show_cmd(incident_id: str, agent_url: str, token_file: str | None, as_json: bool) -> None:
    rec = fetch_record(agent_url, incident_id, headers_or_fail(token_file))
    if as_json:
        echo_json(rec)
        return
    click.echo(summary(rec))


@incident_group.command(
    "export", help="Write one incident's folder as a .tar.gz (for a bug report)."
)
@click.argument("incident_id", metavar="ID")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="The .tar.gz to write.",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@agent_option
@token_option
@handle_errors
def export_cmd(
    incident_id: str, out: Path, force: bool, agent_url: str, token_file: str | None
) -> None:
    import httpx

    from kcops.agent.atomicfile import tmp_name

    headers = headers_or_fail(token_file)
    if out.exists() and not force:
        raise ConfigError(f"--out {out}: exists; pass --force to overwrite it")
    tmp = tmp_name(out)
    url = agent_url.rstrip("/") + _path(incident_id, "/export")
    try:
        with httpx.stream("GET", url, headers=headers, timeout=30) as resp:
            if resp.status_code != 200:
                resp.read()
                _check(resp, agent_url, headers, incident_id)
            with open(tmp, "wb") as fh:
                for chunk in resp.iter_bytes():
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, out)  # whole or not at all: a broken download leaves no file
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise Unreachable(f"cannot reach the agent at {agent_url}: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"--out {out}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    click.echo(f"incident {one_line(incident_id)} written: {out} ({out.stat().st_size} bytes)")
