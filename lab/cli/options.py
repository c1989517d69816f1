"""What the lab commands share: option parsers, the model loader, writing results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


def parse_p(raw: str) -> tuple[float, ...]:
    """``"0.9,0.95"`` -> (0.9, 0.95); each in (0, 1]."""
    try:
        values = tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: expected numbers in (0, 1], e.g. 0.9,0.95", param_hint="--p"
        ) from None
    if not values or not all(0.0 < p <= 1.0 for p in values):
        raise click.BadParameter(
            f"{raw!r}: every p must be in (0, 1], e.g. 0.9,0.95", param_hint="--p"
        )
    return tuple(dict.fromkeys(values))


def parse_rows(raw: str) -> str | int:
    """``last``, ``all`` or a positive int N."""
    raw = raw.strip()
    if raw in ("last", "all"):
        return raw
    if raw.isdigit() and int(raw) >= 1:
        return int(raw)
    raise click.BadParameter(
        f"{raw!r}: allowed 'last', 'all' or a positive integer", param_hint="--rows"
    )


def check_model(name: str) -> None:
    if name in ("tiny", "smollm2"):
        return
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise click.BadParameter(
            f"{name!r}: allowed 'tiny', 'smollm2' or a local Hugging Face model folder "
            "(with config.json)",
            param_hint="--model",
        )


def read_text(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise click.BadParameter(f"{path!r}: no such file", param_hint="--text") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path!r}: cannot read as UTF-8 text: {exc}") from None
    if not text.strip():
        raise click.BadParameter(f"{path!r}: the file is empty", param_hint="--text")
    return text


def load_model(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    from kcops.worker.models import load_model

    return load_model(name, progress=True, attn_implementation="sdpa")


def parse_ints(raw: str, hint: str) -> tuple[int, ...]:
    """``"16,32,64"`` -> (16, 32, 64); each a positive integer, duplicates dropped."""
    try:
        values = tuple(int(x) for x in raw.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(
            f"{raw!r}: expected positive integers, e.g. 16,32,64", param_hint=hint
        ) from None
    if not values or min(values) < 1:
        raise click.BadParameter(
            f"{raw!r}: expected positive integers, e.g. 16,32,64", param_hint=hint
        )
    return tuple(sorted(dict.fromkeys(values)))


def parse_policies(raw: str) -> tuple[str, ...]:
    from kcops.lab.sweep import POLICIES

    values = tuple(dict.fromkeys(x.strip() for x in raw.split(",") if x.strip()))
    bad = [v for v in values if v not in POLICIES]
    if not values or bad:
        raise click.BadParameter(f"{raw!r}: allowed {', '.join(POLICIES)}", param_hint="--policies")
    return values


def save(out_dir: str | None, name: str, doc: object) -> None:
    if out_dir is None:
        return
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(doc), encoding="utf-8")
