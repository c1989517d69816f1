"""``kc retrieve``: generated retrieval items and their teacher-forced scoring under a KV budget.

Two tasks, each item a prompt of exactly ``length`` tokens and an answer of a space
and 5 digits (SmolLM2's tokenizer writes every digit as its own token):

- ``passkey``: neutral filler sentences with "The pass key is 71432. Remember it.
  71432 is the pass key." at a chosen depth (fraction of the filler), asked for at
  the end: "What is the pass key? The pass key is" (Mohtashami & Jaggi's pass key).
- ``code``: a slice of the standard library's source with ``TOKEN_LIMIT_XYZ = 71432``
  at the chosen depth, used at the end: ``value = TOKEN_LIMIT_XYZ`` /
  ``assert value ==``.

Items are built from token ids (the pieces are tokenized on their own and joined), so
the key's position is exact; item ``i`` of a (task, length, depth) cell depends only on
the seed and ``i`` (a cell can grow later and keep its first items).

Scoring is teacher-forced: the prompt is prefilled with full attention (as the worker
does); its last position's logits give the first answer token; then the cache is cut
to the policy's budget (:mod:`kcops.lab.sweep`'s machinery, every plan in one
batch) and the answer's tokens are fed one at a time, each step's greedy token
compared with the next answer token. An item is correct when every answer token is
the greedy argmax. That equals greedy generation's exact match: while the greedy
tokens so far equal the answer's, the fed tokens are the ones generation would have
fed, so the steps are identical up to the first miss, and a miss fails both.
"""

from __future__ import annotations

import random
import string
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kcops.lab.sweep import (
    GROUPS_PER_PASS,
    Decoded,
    SweepError,
    budgets,
    decode_groups,
    is_kvpress,
    prefill,
    press_decoded,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

TASKS = ("passkey", "code")
KEY_DIGITS = 5
FILLER = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
    "The river flows to the sea.",
    "Birds sing in the morning.",
    "The road goes on and on.",
)
PASSKEY_INTRO = (
    "There is an important info hidden inside a lot of irrelevant text. "
    "Find it and memorize it. I will quiz you about the important information there."
)
PASSKEY_QUESTION = " What is the pass key? The pass key is"


@dataclass(frozen=True)
class Item:
    task: str
    length: int
    depth: float
    index: int
    ids: list[int]  # the prompt, exactly ``length`` tokens
    answer: list[int]  # " " + the key's digits
    key: str
    key_pos: int  # token index of the needle's first token in ``ids``


def _rng(seed: int, task: str, length: int, depth: float, index: int) -> random.Random:
    return random.Random(f"{seed}|{task}|{length}|{depth:.6f}|{index}")


def _ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tok(text, add_special_tokens=False).input_ids)


class Builder:
    """Makes items for one tokenizer; tokenized pieces are cached."""

    def __init__(self, tok: PreTrainedTokenizerBase, seed: int) -> None:
        self.tok = tok
        self.seed = seed
        self._sentences = [_ids(tok, " " + s) for s in FILLER]
        self._code: list[list[int]] | None = None

    def code_lines(self) -> list[list[int]]:
        """The standard library's source, a line (with its newline) a token list."""
        if self._code is None:
            root = Path(sysconfig.get_paths()["stdlib"])
            lines: list[str] = []
            for f in sorted(root.glob("*.py")):
                try:
                    lines += f.read_text(encoding="utf-8").splitlines(keepends=True)
                except (OSError, UnicodeDecodeError):
                    continue
                if len(lines) >= 40_000:
                    break
            lines = [ln for ln in lines if ln.strip()]
            self._code = [list(x) for x in self.tok(lines, add_special_tokens=False).input_ids]
        return self._code

    def item(self, task: str, length: int, depth: float, index: int) -> Item:
        if task not in TASKS:
            raise SweepError(f"task {task!r}: allowed {', '.join(TASKS)}")
        if not 0.0 <= depth <= 1.0:
            raise SweepError(f"depth {depth}: must be in [0, 1]")
        rng = _rng(self.seed, task, length, depth, index)
        key = str(rng.randint(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS - 1))
        answer = _ids(self.tok, " " + key)
        if task == "passkey":
            head = _ids(self.tok, PASSKEY_INTRO)
            needle = _ids(self.tok, f" The pass key is {key}. Remember it. {key} is the pass key.")
            tail = _ids(self.tok, PASSKEY_QUESTION)
            pieces = self._passkey_filler(rng, length)
        else:
            name = "TOKEN_LIMIT_" + "".join(rng.choices(string.ascii_uppercase, k=3))
            head = _ids(self.tok, "# settings and helpers\n")
            needle = _ids(self.tok, f"{name} = {key}\n")
            tail = _ids(self.tok, f"\n\ndef test_limit():\n    value = {name}\n    assert value ==")
            pieces = self._code_filler(rng)
        room = length - len(head) - len(needle) - len(tail)
        if room < 0:
            raise SweepError(f"length {length}: a {task} item needs at least {length - room}")
        filler = _fill(pieces, room)  # whole pieces, the last one cut to fit
        at = _boundary(filler, depth * room)
        flat = [t for p in filler for t in p]
        cut = sum(len(p) for p in filler[:at])
        ids = head + flat[:cut] + needle + flat[cut:] + tail
        assert len(ids) == length
        return Item(task, length, depth, index, ids, answer, key, len(head) + cut)

    def _passkey_filler(self, rng: random.Random, length: int) -> list[list[int]]:
        out: list[list[int]] = []
        total = 0
        while total < length:
            order = list(range(len(self._sentences)))
            rng.shuffle(order)
            for i in order:
                out.append(self._sentences[i])
                total += len(self._sentences[i])
        return out

    def _code_filler(self, rng: random.Random) -> list[list[int]]:
        lines = self.code_lines()
        start = rng.randrange(0, len(lines) // 2)
        return lines[start:]


def _fill(pieces: Sequence[list[int]], room: int) -> list[list[int]]:
    out: list[list[int]] = []
    total = 0
    for p in pieces:
        if total >= room:
            break
        take = p[: room - total]
        out.append(take)
        total += len(take)
    if total < room:
        raise SweepError(f"not enough filler for {room} tokens")
    return out


def _boundary(pieces: Sequence[list[int]], want: float) -> int:
    """The piece boundary (0 .. len(pieces)) whose token offset is nearest ``want``."""
    best, best_d, pos = 0, abs(want), 0
    for i, p in enumerate(pieces):
        pos += len(p)
        if abs(pos - want) < best_d:
            best, best_d = i + 1, abs(pos - want)
    return best


# -- scoring -------------------------------------------------------------------------
def score_batch(
    model: PreTrainedModel,
    items: Sequence[Item],
    plans: Sequence[tuple[str, int | None]],
) -> list[dict[str, Any]]:
    """For each ``(policy, n)`` plan (``("full", None)`` for full attention): per item
    whether every answer token is the greedy argmax, and the plan's KV bytes and keys
    attended. All items must share one prompt length and answer length."""
    lengths = {(len(it.ids), len(it.answer)) for it in items}
    if len(lengths) != 1:
        raise SweepError("a batch's items must share their prompt and answer lengths")
    ((length, a),) = lengths
    if a < 2:
        raise SweepError("an answer needs at least 2 tokens")
    seqs = torch.tensor([it.ids + it.answer for it in items])  # (S, L + A)
    answer = seqs[:, length:]
    pre = prefill(model, seqs, a - 1, keep_last=True)  # prefill: the L prompt tokens
    assert pre.last is not None and pre.start == length
    first = pre.last.argmax(-1)  # (S,) the first answer token, full attention's
    layers = len(pre.kv)
    context = seqs.shape[1] - 1
    own = [(p, n) for p, n in plans if not is_kvpress(p)]
    pressed = [(p, n) for p, n in plans if n is not None and is_kvpress(p)]
    specs: list[tuple[list[int | None], bool]] = []
    for p, n in own:
        per: list[int | None] = (
            [None] * layers if n is None else budgets(p, n, layers, context, pre.kp)
        )
        specs.append((per, p != "window"))
    results: dict[tuple[str, int | None], Decoded] = {}
    for lo in range(0, len(specs), GROUPS_PER_PASS):
        chunk = decode_groups(model, pre, specs[lo : lo + GROUPS_PER_PASS])
        results.update(zip(own[lo : lo + GROUPS_PER_PASS], chunk, strict=True))
    for pressed_plan, dec, _, _ in press_decoded(model, seqs, pre, pressed):
        results[pressed_plan] = dec
    out: list[dict[str, Any]] = []
    for plan in plans:
        res = results[plan]
        pred = torch.cat([first[:, None], res["logits"].argmax(-1)], dim=1)
        out.append(
            {
                "correct": [bool(x) for x in (pred == answer).all(dim=1)],
                "kv_bytes": int(res["kv_bytes"]),
                "keys_attended": float(res["keys_attended"]),
            }
        )
    return out
