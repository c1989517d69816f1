"""Where the read commands get their series: one agent, or the Prometheus that scrapes
every sidecar (Prometheus, Thanos, Mimir: any Prometheus-compatible query API).

Both speak the same ``/api/v1/query`` and ``/api/v1/query_range``, so ``kcops cost``,
``kcops kc recommend`` and ``kcops report`` run one implementation over either: the agent
answers for its own pod over what its store keeps (``store.retention_s``), Prometheus for
every pod it scrapes (optionally narrowed by ``--selector``) over what it keeps.

Every answer says the window it covers (:meth:`Source.coverage`): the first moment in the
window asked at which the source holds any sample of the agents' own
``kcops_agent_build_info``, so a sidecar that keeps an hour never answers under a
"24h" heading as if it held a day.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import click

from kcops.cli.common import DEFAULT_AGENT, handle_errors
from kcops.cli.timefmt import duration
from kcops.errors import ConfigError

F = TypeVar("F", bound=Callable[..., object])
HELD = "kcops_agent_build_info"  # every agent exports it from its start: what a source holds
# A command's whole time with its source (each query has ``timeout_s`` of wall-clock
# time): a source that answers each just in time cannot hold it for long either. A long
# report on a loaded agent waits out its refusals (kcops.cli.common.retry_unavailable).
DEADLINE_S = 300.0
COVERAGE_STEPS = 240  # resolution of the coverage probe (a range query of this many steps)
_BARE_METRIC = re.compile(r"(?<![\w:])(kcops_\w+)(?![\w{(])")
_SELECTOR = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*$')


def check_selector(text: str) -> str:
    """``text`` if it is label matchers as in ``{...}`` (``namespace="prod",pod=~"a.*"``),
    without the braces; raises ConfigError naming the one that is not."""
    text = text.strip().strip("{}").strip()
    if not text:
        return ""
    for part in _split(text):
        if not _SELECTOR.match(part):
            raise ConfigError(
                f"--selector: {part.strip()!r} is not a label matcher "
                '(name="value", name!="value", name=~"re" or name!~"re", comma-separated)'
            )
    return text


def _split(text: str) -> list[str]:
    """Comma-separated matchers; commas inside quoted values stay."""
    parts, cur, quoted, escaped = [], "", False, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "," and not quoted:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    return [p for p in parts if p.strip()]


@dataclass(frozen=True)
class Window:
    """The window asked and the part of it the source holds."""

    asked_start: float
    start: float  # the first moment the source holds data (>= asked_start)
    end: float

    @property
    def partial(self) -> bool:
        return self.start > self.asked_start + 1.0

    def as_json(self) -> dict[str, float | bool]:
        return {
            "asked_start": self.asked_start,
            "start": self.start,
            "end": self.end,
            "asked_s": self.end - self.asked_start,
            "covered_s": self.end - self.start,
            "partial": self.partial,
        }

    def line(self, what: str) -> str:
        """``covers 1h05m of the 24h asked (the agent at URL holds nothing earlier)``."""
        asked, got = duration(self.end - self.asked_start), duration(self.end - self.start)
        if not self.partial:
            return f"window: the last {asked}, all held by {what}"
        return f"window: covers {got} of the {asked} asked ({what} holds nothing earlier)"


class Source:
    """A query API: one agent's or a Prometheus's, with an optional label selector that
    every series the commands read is narrowed by."""

    def __init__(
        self, url: str, kind: str, selector: str = "", timeout_s: float = 10.0,
        deadline_s: float = DEADLINE_S,
    ) -> None:  # fmt: skip
        from kcops.cli.topdata import AgentClient

        self.url = url.rstrip("/")
        self.kind = kind  # "agent" or "prometheus"
        self.selector = check_selector(selector)
        self.client = AgentClient(self.url, timeout_s=timeout_s, deadline_s=deadline_s)

    @property
    def what(self) -> str:
        where = f"the {'agent' if self.kind == 'agent' else 'Prometheus'} at {self.url}"
        return where + (f" ({{{self.selector}}})" if self.selector else "")

    def sel(self, metric: str, extra: str = "") -> str:
        """``metric{selector,extra}``."""
        matchers = ",".join(m for m in (self.selector, extra) if m)
        return f"{metric}{{{matchers}}}" if matchers else metric

    def narrow(self, expr: str) -> str:
        """``expr`` with the selector added to each kcops metric it names without one (a
        report panel's query, written for any source)."""
        if not self.selector:
            return expr
        return _BARE_METRIC.sub(lambda m: self.sel(m.group(1)), expr)

    def coverage(self, start: float, end: float) -> Window:
        """The part of ``start..end`` the source holds (see the module docstring)."""
        step = max(15.0, (end - start) / COVERAGE_STEPS)
        rows = self.client.matrix(f"count({self.sel(HELD)})", start, end, step)
        times = sorted(t for _, pts in rows for t in pts)
        first = max(start, times[0] - step) if times else end
        if first - start <= step:  # held from the first step on: the whole window
            first = start
        return Window(start, first, end)

    def close(self) -> None:
        self.client.close()


def source_options(fn: F) -> F:
    """``--agent URL`` or ``--prometheus URL``, and ``--selector``: the read commands'
    source. The function gets ``source`` (a :class:`Source`, to close); a refused
    ``--selector`` is one line and exit 2, like the command's own errors."""

    @click.option(
        "--agent", "agent_url", envvar="KCOPS_AGENT", default=DEFAULT_AGENT, show_default=True,
        help="Base URL of a running kcops agent: its own pod, over what its store keeps.",
    )  # fmt: skip
    @click.option(
        "--prometheus", "prometheus_url", envvar="KCOPS_PROMETHEUS", default=None,
        help="Base URL of the Prometheus (or Thanos, Mimir) that scrapes the sidecars: every "
        "pod, over what it keeps. Takes the place of --agent.",
    )  # fmt: skip
    @click.option(
        "--selector", default="",
        help='Label matchers every series is narrowed by, e.g. \'namespace="prod"\'.',
    )  # fmt: skip
    @functools.wraps(fn)
    @handle_errors
    def wrapped(
        *args: object, agent_url: str, prometheus_url: str | None, selector: str, **kw: object
    ) -> object:
        if prometheus_url:
            source = Source(prometheus_url, "prometheus", selector)
        else:
            source = Source(agent_url, "agent", selector)
        try:
            return fn(*args, source=source, **kw)
        finally:
            source.close()

    return wrapped  # type: ignore[return-value]
