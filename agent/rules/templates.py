"""The subset of Go text/template that Prometheus rule annotations use.

Supported: ``{{ $value }}``, ``{{ $labels.x }}``, ``{{ .Labels.x }}``,
``{{ .Value }}``, ``$externalLabels``, pipelines (``{{ $value | humanize }}``)
and the functions in :data:`FUNCS`. Anything else (``if``, ``range``, other
functions, unknown variables) is refused at load with :class:`RuleError`.

Bounded, since one ``printf`` width once took the agent to 2.4 GB: an
expansion's output is at most 64 KiB (templatebound.py), ``printf`` widths are
capped (gofmt.py), and the functions of one expansion may produce at most 1 MiB
together, past which it fails as Prometheus shows a failed expansion.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kcops.agent.promql.gofmt import go_g4, go_sprintf, go_value
from kcops.agent.promql.model import RuleError
from kcops.agent.rules.templatebound import (
    MAX_OUTPUT_BYTES,
    OverWork,
    TemplateRuntimeError,
    TemplateStats,
    Work,
    bound_output,
)


def _num(v: object) -> float:
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            raise TemplateRuntimeError(f"can't convert {v!r} to float") from None
    if isinstance(v, int | float):
        return float(v)
    raise TemplateRuntimeError(f"can't convert {type(v).__name__} to float")


def humanize(v: object) -> str:
    x = _num(v)
    if x == 0 or math.isnan(x) or math.isinf(x):
        return go_g4(x)
    if abs(x) >= 1:
        return _scaled(x, 1000, ("k", "M", "G", "T", "P", "E", "Z", "Y"))
    return _scaled(x, 1000, ("m", "u", "n", "p", "f", "a", "z", "y"), down=True)


def _scaled(x: float, base: int, prefixes: tuple[str, ...], down: bool = False) -> str:
    """Scale ``x`` by ``base`` until it is in [1, base) (or stop at the last prefix),
    naming each step with the next SI/IEC prefix, as Prometheus's humanize does."""
    prefix = ""
    for p in prefixes:
        if (abs(x) >= 1) if down else (abs(x) < base):
            break
        prefix = p
        x = x * base if down else x / base
    return go_g4(x) + prefix


def humanize1024(v: object) -> str:
    x = _num(v)
    if abs(x) <= 1 or math.isnan(x) or math.isinf(x):
        return go_g4(x)
    return _scaled(x, 1024, ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"))


def humanize_duration(v: object) -> str:
    x = _num(v)
    if math.isnan(x) or math.isinf(x):
        return go_g4(x)
    if x == 0:
        return go_g4(x) + "s"
    if abs(x) >= 1:
        sign = ""
        if x < 0:
            sign = "-"
            x = -x
        d = int(x)
        seconds = d % 60
        minutes = (d // 60) % 60
        hours = (d // 3600) % 24
        days = d // 86400
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{go_g4(x)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(x) >= 1:
            break
        prefix = p
        x *= 1000
    return f"{go_g4(x)}{prefix}s"


def humanize_percentage(v: object) -> str:
    return go_g4(_num(v) * 100) + "%"


FUNCS: dict[str, Callable[..., str]] = {
    "humanize": humanize,
    "humanize1024": humanize1024,
    "humanizeDuration": humanize_duration,
    "humanizePercentage": humanize_percentage,
    "printf": lambda fmt, *args: go_sprintf(str(fmt), list(args)),
    "toUpper": lambda s: str(s).upper(),
    "toLower": lambda s: str(s).lower(),
}
VARIABLES = {
    "$labels": "Labels",
    "$value": "Value",
    "$externalLabels": "ExternalLabels",
    "$externalURL": "ExternalURL",
}
FIELDS = frozenset({"Labels", "Value", "ExternalLabels", "ExternalURL"})
KEYWORDS = frozenset(
    {"if", "else", "end", "range", "with", "define", "template", "block", "break", "continue"}
)


# -- parsing -------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)
  | (?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<var>\$[A-Za-z_0-9]*(?:\.[A-Za-z_0-9]+)*)
  | (?P<field>(?:\.[A-Za-z_0-9]+)+|\.)
  | (?P<ident>[A-Za-z_][A-Za-z_0-9]*)
  | (?P<pipe>\|)
  | (?P<lp>\()
  | (?P<rp>\))
    )""",
    re.VERBOSE,
)

Node = tuple[Any, ...]


@dataclass(frozen=True)
class Template:
    source: str
    parts: tuple[Any, ...]  # str or a pipeline node

    def render(
        self,
        labels: Mapping[str, str],
        value: float,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
        stats: TemplateStats | None = None,
    ) -> str:
        """The expansion, at most :data:`MAX_OUTPUT_BYTES`; ``stats`` counts the bounds hit."""
        data = {
            "Labels": dict(labels),
            "Value": value,
            "ExternalLabels": dict(external_labels or {}),
            "ExternalURL": external_url,
        }
        out = []
        size = 0
        work = Work()
        try:
            for p in self.parts:
                out.append(p if isinstance(p, str) else go_value(_eval_pipeline(p, data, work)))
                size += len(out[-1])
                if size > MAX_OUTPUT_BYTES:  # characters: already more bytes than the bound
                    break
        except TemplateRuntimeError as exc:
            if isinstance(exc, OverWork) and stats is not None:
                stats.over_work += 1
            return bound_output(f"<error expanding template: {exc}>", stats)
        return bound_output("".join(out), stats)


def _unquote(tok: str) -> str:
    if tok.startswith("`"):
        return tok[1:-1]
    return bytes(tok[1:-1], "utf-8").decode("unicode_escape")


def _parse_pipeline(tokens: list[tuple[str, str]], pos: int) -> tuple[Node, int]:
    cmds: list[Node] = []
    while True:
        args: list[Node] = []
        while pos < len(tokens) and tokens[pos][0] not in ("pipe", "rp"):
            kind, text = tokens[pos]
            if kind == "lp":
                sub, pos = _parse_pipeline(tokens, pos + 1)
                if pos >= len(tokens) or tokens[pos][0] != "rp":
                    raise RuleError("unclosed '(' in template")
                args.append(sub)
                pos += 1
                continue
            args.append(_operand(kind, text, first=not args))
            pos += 1
        if not args:
            raise RuleError("missing value in template pipeline")
        cmds.append(("cmd", tuple(args)))
        if pos < len(tokens) and tokens[pos][0] == "pipe":
            pos += 1
            continue
        return ("pipeline", tuple(cmds)), pos


def _operand(kind: str, text: str, first: bool) -> Node:
    if kind == "str":
        return ("lit", _unquote(text))
    if kind == "num":
        if any(c in text for c in ".eE"):
            return ("lit", float(text))
        if len(text.lstrip("+-")) > 19 or not -(2**63) <= int(text) < 2**63:
            raise RuleError(f"number {text[:30]!r} in template overflows int64")
        return ("lit", int(text))
    if kind == "var":
        head, *path = text.split(".")
        if head not in VARIABLES:
            raise RuleError(f"undefined variable {head!r} in template")
        return ("field", (VARIABLES[head], *path))
    if kind == "field":
        path = [p for p in text.split(".") if p]
        if path and path[0] not in FIELDS:
            raise RuleError(f"unknown field .{path[0]} in template")
        return ("field", tuple(path))
    if kind == "ident":
        if text in KEYWORDS:
            raise RuleError(f"template action {text!r} is not supported by kcops")
        if text in ("true", "false"):
            return ("lit", text == "true")
        if text not in FUNCS:
            allowed = ", ".join(sorted(FUNCS))
            raise RuleError(f'function "{text}" not defined in templates (supported: {allowed})')
        if not first:
            return ("fn", text, ())
        return ("fn", text, ())
    raise RuleError(f"unexpected {text!r} in template")


def compile_template(text: str) -> Template:
    """Parse at load; raises :class:`RuleError` naming what is wrong."""
    parts: list[Any] = []
    pos = 0
    while True:
        start = text.find("{{", pos)
        if start < 0:
            parts.append(text[pos:])
            break
        end = text.find("}}", start)
        if end < 0:
            raise RuleError(f"unclosed action in template {text!r}")
        lit = text[pos:start]
        inner = text[start + 2 : end]
        if inner.startswith("-") and inner[1:2] in (" ", "\t", "\n"):
            lit = lit.rstrip()
            inner = inner[1:]
        pos = end + 2
        if inner.endswith("-") and inner[-2:-1] in (" ", "\t", "\n"):
            inner = inner[:-1]
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
        parts.append(lit)
        body = inner.strip()
        if body.startswith("/*"):
            continue
        tokens = _tokenize(body)
        if not tokens:
            raise RuleError(f"missing value for command in template {text!r}")
        node, used = _parse_pipeline(tokens, 0)
        if used != len(tokens):
            raise RuleError(f"unexpected {tokens[used][1]!r} in template {text!r}")
        parts.append(node)
    return Template(text, tuple(p for p in parts if p != ""))


def _tokenize(body: str) -> list[tuple[str, str]]:
    tokens = []
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None or m.end() == pos:
            rest = body[pos:].strip()
            if not rest:
                break
            raise RuleError(f"unexpected {rest[:10]!r} in template action {body!r}")
        kind = m.lastgroup
        assert kind is not None
        tokens.append((kind, m.group(kind)))
        pos = m.end()
    return tokens


# -- evaluation ----------------------------------------------------------------


def _eval_pipeline(node: Node, data: dict[str, object], work: Work) -> object:
    result: object = None
    have = False
    for _, args in node[1]:
        head = args[0]
        if head[0] == "fn":
            vals = [_eval_arg(a, data, work) for a in args[1:]]
            if have:
                vals.append(result)
            result = _call(head[1], vals, work)
        else:
            if len(args) > 1 or have:
                raise TemplateRuntimeError("can't give argument to non-function")
            result = _eval_arg(head, data, work)
        have = True
    return result


def _call(name: str, vals: list[object], work: Work) -> str:
    if name == "printf" and vals:
        # Stops formatting once past what is left of the work bound.
        return work.charge(go_sprintf(str(vals[0]), vals[1:], limit=work.left()))
    return work.charge(FUNCS[name](*vals))


def _eval_arg(node: Node, data: dict[str, object], work: Work) -> object:
    kind = node[0]
    if kind == "lit":
        return node[1]
    if kind == "pipeline":
        return _eval_pipeline(node, data, work)
    if kind == "fn":
        return _call(node[1], [], work)
    cur: object = data
    for name in node[1]:
        if isinstance(cur, dict):
            cur = cur.get(name, "")
        else:
            raise TemplateRuntimeError(f"can't evaluate field {name}")
    return cur
