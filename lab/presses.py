"""NVIDIA's kvpress compressors as ``kc sweep`` policies, run in kvpress's own venv.

A policy ``kvpress:<press>`` compresses the prefilled cache once, at the same N as
kcops' own policies (``compression_ratio`` = 1 - N / prefilled tokens), and decodes
with the cache growing; ``kvpress:<press>+decode`` also cuts it back to N at every
decode step (kvpress's ``DecodingPress``, interval 1), as kcops' own path does.
``kvpress:kc`` is ``PerLayerCompressionPress`` around SnapKV with the per-layer N
that kcops derives from the prefill's measured K_0.9 (:func:`kcops.lab.sweep.budgets`,
``per_layer``), beside ``pyramidkv`` (a fixed pyramid) and ``adakv`` (per head), all
three at the same mean N.

The sweep cuts the sequences, prefills its own side, and scores and pools every row;
this module only ships the same token ids to :mod:`kcops.lab.kvpress_side` in the venv
(``make venv-kvpress``, or ``KCOPS_KVPRESS_VENV``) and reads back logits. The side
hashes the ids it ran; a different hash stops the sweep (the two sides would score
different text).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch

from kcops.lab.kvpress_side import DECODING, SCORERS, fingerprint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

PREFIX = "kvpress:"
KC = "kc"  # PerLayerCompressionPress with K(C)'s per-layer N
PRESSES = (*SCORERS, "pyramidkv", "adakv", KC)
POLICIES = tuple(PREFIX + p for p in PRESSES) + tuple(f"{PREFIX}{p}+decode" for p in DECODING)
VENV_ENV = "KCOPS_KVPRESS_VENV"
SIDE = Path(__file__).with_name("kvpress_side.py")


class Result(TypedDict):
    """One job as the side ran it; ``sha`` names the sequences it ran."""

    logits: torch.Tensor  # (S, steps, V)
    step_s: float  # median decode step
    kv_bytes: int  # peak per sequence (AdaKV's masked keys left out)
    keys_attended: float  # mean over layers and steps
    kept: list[int]  # per layer, after the prefill's compression
    sha: str
    versions: dict[str, str]


class PressError(RuntimeError):
    """The kvpress side failed or is missing (a SweepError for the CLI)."""


def venv() -> Path:
    root = Path(
        os.environ.get(VENV_ENV) or Path(__file__).resolve().parent.parent / ".venv-kvpress"
    )
    if not (root / "bin" / "python").exists():
        raise PressError(
            f"kvpress policies run in kvpress's own venv and {root} has none: run "
            f"`make venv-kvpress` (or set {VENV_ENV} to a venv with kvpress 0.5.5)"
        )
    return root


def job(policy: str, n: int, start: int, per_layer: Sequence[int | None]) -> dict[str, object]:
    """The side's job for ``policy`` at N (``per_layer``: kcops' K(C) split of N)."""
    press, _, mode = policy.removeprefix(PREFIX).partition("+")
    ratio = _ratio(n, start)
    out: dict[str, object] = {"press": press, "ratio": ratio}
    if press == KC:
        out.update(press="per_layer", ratios=[_ratio(x, start) for x in per_layer])
    if mode == "decode":
        out["decode_n"] = n
    return out


def _ratio(n: int | None, start: int) -> float:
    """kvpress keeps ``int(len * (1 - ratio))``: half a key over N keeps exactly N."""
    return 0.0 if n is None or n >= start else max(0.0, 1.0 - (n + 0.5) / start)


def model_folder(model: PreTrainedModel, scratch: Path) -> Path:
    """The model's weights as a folder the side loads (the tiny model is saved)."""
    src = Path(str(getattr(model, "name_or_path", "") or ""))
    if (src / "config.json").is_file():
        return src
    model.save_pretrained(str(scratch / "model"))
    return scratch / "model"


def run(
    model: PreTrainedModel, seqs: torch.Tensor, start: int, jobs: Sequence[dict[str, object]]
) -> Iterator[Result]:
    """The side's full-attention job's result, then each job's in order. Raises
    :class:`PressError` when the side fails or ran other sequences than ``seqs``."""
    python = venv() / "bin" / "python"
    with tempfile.TemporaryDirectory(prefix="kcops-kvpress-") as tmp:
        scratch = Path(tmp)
        request = {
            "threads": torch.get_num_threads(), "seqs": seqs.to(torch.int64),
            "start": start, "model": str(model_folder(model, scratch)),
            "dtype": str(model.dtype).removeprefix("torch."),
            "jobs": [{"press": "full", "ratio": 0.0}, *jobs],
        }  # fmt: skip
        torch.save(request, scratch / "request.pt")
        cmd = [str(python), str(SIDE), str(scratch / "request.pt"), str(scratch)]
        log = scratch / "side.log"  # a file, not a pipe: its warnings never block it
        with log.open("w") as err, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err,
                                                      text=True) as p:  # fmt: skip
            assert p.stdout is not None
            try:
                yield from _results(p.stdout, fingerprint(seqs), len(jobs) + 1)
            except PressError as exc:
                p.kill()
                p.wait()
                tail = log.read_text(errors="replace")[-2000:]
                raise PressError(f"{exc}\n{' '.join(cmd)}:\n{tail}") from None
            finally:
                p.kill()


def _results(lines: Iterator[str], sha: str, count: int) -> Iterator[Result]:
    head = json.loads(next(lines, "null") or "null")
    if not isinstance(head, dict):
        raise PressError("the kvpress side stopped before it started (see its error below)")
    if head.get("sha") != sha:
        raise PressError(
            f"the kvpress side ran sequences {head.get('sha')}, the sweep cut {sha}: "
            "the two sides would score different text"
        )
    for i in range(count):
        line = next(lines, "")
        if not line:
            raise PressError(f"the kvpress side stopped after {i} of {count} jobs")
        doc = json.loads(line)
        yield Result(
            logits=torch.load(str(doc["logits"]), weights_only=True), step_s=float(doc["step_s"]),
            kv_bytes=int(doc["kv_bytes"]), keys_attended=float(doc["keys_attended"]),
            kept=[int(x) for x in doc["kept"]], sha=sha, versions=dict(head.get("versions") or {}),
        )  # fmt: skip
