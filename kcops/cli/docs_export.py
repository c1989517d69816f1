"""The generated references of the docs site, from the code itself:

- ``docs/reference/config.md``: every key of the agent's configuration, from the pydantic
  models that ``kcops agent default-config`` prints and ``check-config`` validates (type,
  default, bounds, description);
- ``docs/reference/cli.md``: every ``kcops`` command, from click (usage, help, options).

``python -m kcops.cli.docs_export --root .`` writes both (``make docs`` runs it before
``mkdocs build --strict``); tests/unit/docs/test_reference.py fails when the committed
files drift from the code or miss a key or command.
"""

from __future__ import annotations

import argparse
import json
import types
import typing
from pathlib import Path

import click
from pydantic import BaseModel
from pydantic.fields import FieldInfo

CONFIG_MD = Path("docs/reference/config.md")
CLI_MD = Path("docs/reference/cli.md")
_BOUNDS = (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))


# -- configuration --------------------------------------------------------------------


def _type(ann: object) -> str:
    """A readable type: ``float (seconds or a duration like 5m)``, ``"auto" | "on"``..."""
    origin = typing.get_origin(ann)
    args = typing.get_args(ann)
    if origin is typing.Annotated:
        inner = _type(args[0])
        if any(getattr(m, "__name__", "") == "seconds" for m in _validators(args[1:])):
            return "duration (seconds, or 30s, 5m, 1h)"
        return inner
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin in (dict, list, tuple, set, frozenset):
        return f"{origin.__name__}[{', '.join(_type(a) for a in args if a is not Ellipsis)}]"
    if ann is type(None):
        return "null"
    return getattr(ann, "__name__", str(ann))


def _validators(meta: tuple[object, ...]) -> list[object]:
    return [getattr(m, "func", None) for m in meta]


def _bounds(info: FieldInfo) -> str:
    out = []
    for m in info.metadata:
        for attr, sign in _BOUNDS:
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sign} {v:g}" if isinstance(v, float) else f"{sign} {v}")
    return ", ".join(out)


def _default(model: BaseModel, name: str) -> str:
    value = model.model_dump(mode="json")[name]
    text = json.dumps(value).replace(str(Path.home()), "~")  # the same on every machine
    return text if len(text) <= 60 else text[:57] + "..."


def _models_in(ann: object) -> list[type[BaseModel]]:
    """The models a field's type holds (a section, or the values of a dict of models)."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return [ann]
    return [m for a in typing.get_args(ann) for m in _models_in(a)]


def _section(path: str, model: type[BaseModel], out: list[str], keys: list[str]) -> None:
    instance = model.model_construct()
    try:
        instance = model()
    except Exception:  # a model with required fields (a dict's value): no defaults
        pass
    rows = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        sub = _models_in(ann)
        key = f"{path}.{name}" if path else name
        if sub and isinstance(ann, type):  # a section of its own
            nested.append((key, sub[0]))
            continue
        keys.append(key)
        default = "(required)" if info.is_required() else _default(instance, name)
        factory = info.default_factory
        if factory is not None and not isinstance(factory, type) and factory.__doc__:
            # computed where it runs (a path under $HOME): what the factory says it is
            default = factory.__doc__.strip().split("\n")[0].replace("``", "").rstrip(".")
        desc = " ".join((info.description or "").split()).replace("|", "\\|")
        kind = _type(ann)
        if any(getattr(m, "__name__", "") == "seconds" for m in _validators(tuple(info.metadata))):
            kind = "duration (seconds, or 30s, 5m, 1h)"
        rows.append(f"| `{name}` | {kind} | `{default}` | {_bounds(info)} | {desc} |")
        for m in sub:  # dict[str, Model]: the value's keys
            nested.append((f"{key}.<name>", m))
    if rows:
        out += ["", f"## `{path}`" if path else "## top level", ""]
        doc = " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())
        if doc and not doc.startswith(("A configuration section", "Base model")):
            out += [doc, ""]
        out += ["| key | type | default | bounds | description |", "|---|---|---|---|---|", *rows]
    for key, sub_model in nested:
        _section(key, sub_model, out, keys)


def config_reference() -> tuple[str, list[str]]:
    """(the page, every key path in it)."""
    from kcops.agent.config import Config

    out = [
        "# Configuration reference",
        "",
        "Every key of the agent's YAML configuration, generated from the models that "
        "validate it (`python -m kcops.cli.docs_export`). `kcops agent default-config` "
        "prints the defaults as a file to edit; `kcops agent check-config FILE` validates "
        "one. Unknown keys are errors; a duration is seconds or a Prometheus duration "
        "(`30s`, `5m`, `1h`).",
    ]
    keys: list[str] = []
    for name, info in Config.model_fields.items():
        (model,) = _models_in(info.annotation)
        _section(name, model, out, keys)
    return "\n".join(out) + "\n", keys


# -- CLI ----------------------------------------------------------------------------------


def _commands(
    group: click.Group, ctx: click.Context, prefix: str
) -> list[tuple[str, click.Command, click.Context]]:
    out = []
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx)
        path = f"{prefix} {name}"
        out.append((path, cmd, sub))
        if isinstance(cmd, click.Group):
            out += _commands(cmd, sub, path)
    return out


def cli_reference() -> tuple[str, list[str]]:
    """(the page, every command path in it)."""
    from kcops.cli import cli

    root = click.Context(cli, info_name="kcops")
    out = [
        "# CLI reference",
        "",
        "Every `kcops` command, generated from the code (`python -m kcops.cli.docs_export`). "
        "`kcops COMMAND --help` prints the same. The `demo`, `load` and `kc` lab commands "
        "come with the full install (`pip install 'kcops[lab]'`), not with the sidecar image.",
    ]
    paths = []
    for path, cmd, ctx in _commands(cli, root, "kcops"):
        paths.append(path)
        depth = path.count(" ")
        out += ["", f"{'#' * min(depth + 1, 4)} `{path}`", ""]
        help_text = (cmd.help or cmd.short_help or "").strip()
        if help_text:
            out += [click.unstyle(help_text).split("\b")[0].strip(), ""]
        pieces = " ".join(cmd.collect_usage_pieces(ctx))
        out += ["```", f"{path} {pieces}".rstrip(), "```"]
        rows = []
        for param in cmd.get_params(ctx):
            rec = param.get_help_record(ctx)
            if rec is None or param.name == "help":
                continue
            names, text = rec
            cell = text.replace("|", "\\|").replace("\n", " ")
            rows.append(f"| `{names}` | {cell} |")
        if rows:
            out += ["", "| option | description |", "|---|---|", *rows]
    return "\n".join(out) + "\n", paths


def write(root: Path) -> list[Path]:
    written = []
    for rel, (text, _names) in ((CONFIG_MD, config_reference()), (CLI_MD, cli_reference())):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".", help="the repository root")
    for path in write(Path(ap.parse_args().root)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
