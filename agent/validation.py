"""One line for a pydantic :class:`~pydantic.ValidationError`: config and rule files share it.

The line names the file, where (``agent.tick_s``, ``rule 'X': labels.severity``),
what is wrong and what is allowed, with a short excerpt of the bad value
(never the whole value: a key or value can be megabytes), then how many
other problems there are, so one bad file is one line on stderr.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Annotated, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from kcops.agent.yamlload import excerpt

Loc = tuple[int | str, ...]
# Splits an error's location into a prefix naming the object (``rule 'X': ``)
# and the rest of the path inside it.
Where = Callable[[Loc], tuple[str, Loc]]
_PART_CHARS = 60
# pydantic's wording names Python types ("a valid dictionary or instance of RuleModel").
_PLAIN = {
    "model_type": "must be a mapping",
    "dict_type": "must be a mapping",
    "list_type": "must be a list",
    "string_type": "must be a string",
    "int_type": "must be an integer",
    "bool_type": "must be true or false",
    "float_type": "must be a number",
}


def _part(p: int | str) -> str:
    text = str(p)
    return text if len(text) <= _PART_CHARS else text[:_PART_CHARS] + "..."


def render_path(loc: Sequence[int | str]) -> str:
    """``('labels', 'severity')`` -> ``labels.severity``; list indexes as ``[i]``.

    A bad mapping key (pydantic's ``[key]`` marker) is named as ``labels key 'x y'``.
    """
    out = ""
    for i, p in enumerate(loc):
        if p == "[key]":
            continue
        if i + 1 < len(loc) and loc[i + 1] == "[key]":
            out += f" key {excerpt(str(p))}"
        elif isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + _part(p)
    return out.strip()


def _unwrap(annotation: object) -> object:
    """``Annotated[X, ...]`` and ``X | None`` -> ``X``."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        else:
            return annotation


def _inner(annotation: object, part: int | str) -> object:
    """The type one location part into ``annotation``: a model's field, a list's or dict's item."""
    t = _unwrap(annotation)
    if isinstance(t, type) and issubclass(t, BaseModel):
        field = next((f for n, f in t.model_fields.items() if (f.alias or n) == part), None)
        return field.annotation if field is not None else None
    origin = get_origin(t)
    if origin in (list, tuple, set, frozenset) and isinstance(part, int):
        return get_args(t)[0]
    if origin is dict:
        return get_args(t)[1]
    return None


def _allowed_keys(root: type[BaseModel], loc: Loc) -> list[str]:
    model: object = root
    for part in loc:
        model = _inner(model, part)
    model = _unwrap(model)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return sorted(f.alias or n for n, f in model.model_fields.items())
    return []


def _problem(err: ErrorDetails, root: type[BaseModel]) -> str:
    kind = err["type"]
    if kind == "extra_forbidden":
        known = _allowed_keys(root, tuple(err["loc"][:-1]))
        return "unknown key" + (f"; allowed keys: {', '.join(known)}" if known else "")
    ctx = err.get("ctx") or {}
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])[:300]
    got = "" if kind == "missing" else f"; got {excerpt(err.get('input'))}"
    if "expected" in ctx:
        return f"must be one of {str(ctx['expected'])[:300]}{got}"
    return f"{_PLAIN.get(kind, err['msg'][:200])}{got}"


def one_line(
    exc: ValidationError, source: str, root: type[BaseModel], where: Where | None = None
) -> str:
    """``source: where path: problem`` for the first error, and a count of the others."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc: Loc = tuple(first["loc"])
    prefix, rest = where(loc) if where is not None else ("", loc)
    path = render_path(rest)
    head = f"{source}: {prefix}{path}" if path else f"{source}: {prefix}".rstrip(": ")
    line = f"{head}: {_problem(first, root)}"
    if len(errors) > 1:
        n = len(errors) - 1
        line += f" (and {n} more problem{'s' if n > 1 else ''})"
    return line
