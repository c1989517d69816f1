"""``kc sweep``: what an attention budget N buys, measured the way the worker serves it.

For each context length C, ``sequences`` chunks of C + 1 corpus tokens are cut at
fixed offsets (deterministic). Each chunk's first C - E tokens are prefilled with
full attention (scores captured, SnapKV); then the KV cache is cut to the
policy's budget (kcops.kernels.kvkeep) and the last E tokens are fed one at a
time, teacher-forced, as decode steps: the E evaluation positions see C - E + 1
… C tokens of context. The cache is cut back to the budget after every step, as
the worker does, so a compressed layer attends exactly N + 1 keys. Per row:

- accuracy: greedy next token == the text's next token, and the paired standard
  error of its difference with full attention's (same positions);
- agreement: greedy next token == full attention's, same positions, same run;
- perplexity of the text's tokens; latency per decode step and tokens/s;
- kv_bytes: peak KV bytes per sequence while decoding; keys attended (mean over
  layers and steps).

Policies: ``uniform`` (N everywhere), ``per_layer`` (N scaled per layer by the
layer's measured K_0.9, the same total N x layers, no layer above the context:
:func:`share_budget`), ``dense_first`` (layers 0 and 1 whole),
``window`` (sinks + recent only, no heavy hitters), ``kc_live`` (uniform at the cut,
then the same total re-split while decoding from the decode rows' attention at each
layer's budget edge: kcops.lab.kclive). A layer whose N covers the
whole context runs as full attention: nothing would ever be dropped.
"""

from __future__ import annotations

import inspect
import itertools
import math
import statistics
import sysconfig
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from kcops.errors import KcopsError
from kcops.kernels.kvkeep import (
    KeptLayer,
    cache_nbytes,
    capture_scores,
    evict,
    kept_cache,
    use_kept,
)
from kcops.kernels.topn import DENSE, use_policy
from kcops.lab.kclive import LiveBudget, observe_step
from kcops.lab.sweepbatch import group_keys, group_nbytes, grouped_cache

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from kcops.lab.sweepcal import Coverage

POLICIES = ("uniform", "per_layer", "dense_first", "window", "kc_live")
FULL = "full"
DENSE_FIRST = frozenset({0, 1})
GROUPS_PER_PASS = 8  # rows decoded in one batch (kcops.lab.sweepbatch)
TIMED_STEPS = 8  # decode steps timed per row, on its own (their median counts)
TEXT_SUFFIXES = (".py", ".md", ".txt", ".rst")


class SweepError(KcopsError):
    """Bad sweep input (corpus too short, unknown policy). Exit code 2."""

    exit_code = 2


@dataclass
class Row:
    policy: str
    n: int | None
    context: int
    accuracy: float
    accuracy_delta_se: float  # paired standard error of accuracy - full's (0 for full)
    agreement: float
    perplexity: float
    latency_s_per_token: float
    tokens_per_s: float
    kv_bytes: int
    keys_attended: float
    positions: int
    budgets: list[int | None]
    # the same difference's standard error over sequence means (positions of one
    # sequence share its context and are not independent); None in older sweeps
    accuracy_delta_se_seq: float | None = None
    live: dict[str, object] | None = None  # kc_live: budgets over the steps, edge mass, kept K
    # kvpress rows (kcops.lab.presses): the sequences' hash, versions, agreement of the
    # kvpress side's own full attention with this sweep's
    kvpress: dict[str, object] | None = None

    @property
    def delta_se(self) -> float:
        """The error the recommendation trusts: the larger of the two."""
        return max(self.accuracy_delta_se, self.accuracy_delta_se_seq or 0.0)

    @property
    def key(self) -> str:
        return row_key(self.policy, self.n, self.context)

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def row_key(policy: str, n: int | None, context: int) -> str:
    return f"{policy}|{n}|{context}"


def all_policies() -> tuple[str, ...]:
    """kcops' own policies, then kvpress's (kcops.lab.presses)."""
    from kcops.lab.presses import POLICIES as PRESSES

    return POLICIES + PRESSES


def is_kvpress(policy: str) -> bool:
    """A kvpress policy: decoded by kvpress's side (kcops.lab.presses), not by kvkeep."""
    from kcops.lab.presses import PREFIX

    return policy.startswith(PREFIX)


def policy_rank(policy: str) -> int:
    """The order ties are broken in: kcops' own policies first, in :data:`POLICIES` order."""
    return POLICIES.index(policy) if policy in POLICIES else len(POLICIES)


# -- corpus ------------------------------------------------------------------------
def _read_files(files: Iterable[Path], min_chars: int) -> str:
    parts: list[str] = []
    total = 0
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # a binary or unreadable file is not corpus text
        parts.append(text)
        total += len(text)
        if total >= min_chars:
            break
    return "\n\n".join(parts)


def corpus_files(folder: Path) -> list[Path]:
    """The text files of a corpus folder, in the order ``--corpus FOLDER`` reads them."""
    return sorted(p for p in folder.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())


def corpus_text(corpus: str, min_chars: int) -> str:
    """``pydoc`` (CPython's reference docs), ``stdlib`` (its source), a file or a folder."""
    if corpus == "pydoc":
        import pydoc_data.topics as topics

        return "\n\n".join(topics.topics[k] for k in sorted(topics.topics))
    if corpus == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return _read_files(sorted(root.glob("*.py")), min_chars)
    path = Path(corpus).expanduser()
    if path.is_file():
        return _read_files([path], min_chars)
    if path.is_dir():
        return _read_files(corpus_files(path), min_chars)
    raise SweepError(f"--corpus {corpus!r}: allowed pydoc, stdlib, a text file or a folder")


def chunks(ids: Sequence[int], sequences: int, context: int) -> torch.Tensor:
    """``sequences`` consecutive chunks of ``context + 1`` tokens: (S, C + 1)."""
    need = sequences * (context + 1)
    if len(ids) < need:
        raise SweepError(
            f"the corpus has {len(ids)} tokens; {sequences} sequences of {context + 1} "
            f"need {need}: use a larger corpus or fewer --sequences"
        )
    return torch.tensor(ids[:need]).reshape(sequences, context + 1)


# -- budgets -----------------------------------------------------------------------
def budgets(
    policy: str, n: int | None, layers: int, context: int, kp: dict[int, float]
) -> list[int | None]:
    """Per-layer N (None: the layer keeps everything)."""
    if n is None:
        return [None] * layers
    if policy in ("uniform", "window", "dense_first", "kc_live"):  # kc_live: its start
        per = [n] * layers
    elif policy == "per_layer":
        per = share_budget(n * layers, [max(kp.get(i, 1.0), 1.0) for i in range(layers)], context)
    else:
        raise SweepError(f"policy {policy!r}: allowed {', '.join(POLICIES)}")
    out: list[int | None] = [x if x < context else None for x in per]
    if policy == "dense_first":
        out = [None if i in DENSE_FIRST else x for i, x in enumerate(out)]
    return out


def share_budget(total: int, weights: Sequence[float], cap: int) -> list[int]:
    """Split ``total`` keys over layers in proportion to ``weights``, each layer at least
    1 and at most ``cap`` (the context: more keeps nothing more); what a capped layer
    cannot use goes to the others (water-filling). The shares sum to ``min(total,
    cap * layers)`` exactly (largest remainders get the rounding)."""
    layers = len(weights)
    total = min(total, cap * layers)
    share = [0.0] * layers
    free = set(range(layers))
    left = float(total)
    while free:
        scale = left / sum(weights[i] for i in free)
        over = {i for i in free if weights[i] * scale >= cap}
        if not over:
            for i in free:
                share[i] = weights[i] * scale
            break
        for i in over:
            share[i] = float(cap)
        free -= over
        left -= cap * len(over)
    out = [min(cap, max(1, int(x))) for x in share]
    by_remainder = sorted(range(layers), key=lambda i: share[i] - int(share[i]), reverse=True)
    for i in itertools.cycle(by_remainder):  # the rounding's keys: largest remainders first
        if sum(out) >= total:
            break
        if out[i] < cap:
            out[i] += 1
    while sum(out) > total:  # a layer raised to 1 key: taken back from the largest
        out[max(range(layers), key=lambda i: out[i])] -= 1
    return out


# -- one context ---------------------------------------------------------------------
def _cache_kw(model: PreTrainedModel) -> str:
    """transformers >= 5.2x renamed ``past_key_values`` to ``cache``."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def last_only(model: PreTrainedModel) -> dict[str, object]:
    """``logits_to_keep=1`` where the model takes it: only the last position's logits are
    read, and all of them are S x C x vocab floats."""
    params = inspect.signature(model.forward).parameters
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


@dataclass
class Prefilled:
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    scores: dict[int, torch.Tensor]
    kp: dict[int, float]
    feed: torch.Tensor  # (S, E) tokens fed while decoding
    target: torch.Tensor  # (S, E) the text's next tokens
    start: int  # position of the first fed token
    rows: dict[int, dict[float, list[int]]] = field(default_factory=dict)  # sweepcal's K_p
    last: torch.Tensor | None = None  # (S, V) the prefill's last logits (keep_last)


def prefill(
    model: PreTrainedModel,
    seqs: torch.Tensor,
    eval_tokens: int,
    p_grid: tuple[float, ...] = (),
    keep_last: bool = False,
) -> Prefilled:
    from transformers import DynamicCache

    context = seqs.shape[1] - 1
    start = context - eval_tokens
    if start < 1:
        raise SweepError(f"context {context} must exceed --eval-tokens {eval_tokens}")
    cache = DynamicCache(config=model.config)
    kw = {_cache_kw(model): cache, **last_only(model)}  # the sweep reads no prefill logit
    with (
        torch.inference_mode(),
        use_policy(DENSE),
        capture_scores(with_kp=True, p_grid=p_grid) as cap,
    ):
        out = model(input_ids=seqs[:, :start], use_cache=True, **kw)
    last = out.logits[:, -1].float() if keep_last else None  # kc retrieve's first answer token
    layers: list[Any] = list(cache.layers)  # DynamicLayer: keys/values set by the forward
    kv = [(layer.keys, layer.values) for layer in layers]
    feed, target = seqs[:, start:context], seqs[:, start + 1 :]
    return Prefilled(kv, cap.scores, cap.kp, feed, target, start, cap.rows, last)


class Decoded(TypedDict, total=False):
    """What decoding a row gives: its logits (S, steps, V) and costs."""

    logits: torch.Tensor
    step_s: float  # the median decode step (:func:`decode` only)
    kv_bytes: int  # peak KV bytes per sequence
    keys_attended: float  # mean over layers and steps
    live: dict[str, object] | None  # kc_live's evidence (:func:`decode_groups` only)


def _kept_layer(pre: Prefilled, i: int, n: int | None, heavy: bool) -> KeptLayer:
    """Layer ``i`` of the prefilled cache, cut to ``n`` keys (None: whole)."""
    k, v = pre.kv[i]
    layer = KeptLayer()
    layer.update(k, v)
    if n is not None:
        layer.valid = torch.ones(k.shape[:3], dtype=torch.bool)
        layer.score = pre.scores[i].float().clone()
        layer.pos = torch.arange(k.shape[-2]).expand(*k.shape[:3]).clone()
        layer.heavy = heavy
        layer.compress(n)
    return layer


def decode(
    model: PreTrainedModel,
    pre: Prefilled,
    per_layer: list[int | None],
    heavy: bool,
    steps: int | None = None,
) -> Decoded:
    """Teacher-forced decode steps (the first ``steps``, default all) over a cache cut to
    ``per_layer``, one row on its own; logits and costs."""
    s = pre.feed.shape[0]
    steps = pre.feed.shape[1] if steps is None else min(steps, pre.feed.shape[1])
    cache = kept_cache(model.config, len(pre.kv))
    cache.layers = [_kept_layer(pre, i, n, heavy) for i, n in enumerate(per_layer)]
    logits, peak, attended, times = [], 0, 0.0, []
    kw = _cache_kw(model)
    with torch.inference_mode(), use_policy(DENSE), use_kept(cache):
        for j in range(steps):
            pos = torch.full((s, 1), pre.start + j)
            t0 = time.perf_counter()
            out = model(
                input_ids=pre.feed[:, j : j + 1],
                position_ids=pos,
                use_cache=True,
                **{kw: cache},
            )
            times.append(time.perf_counter() - t0)
            logits.append(out.logits[:, -1].float())
            peak = max(peak, cache_nbytes(cache))
            attended += sum(layer.keys.shape[-2] for layer in cache.layers) / len(cache.layers)
            evict(cache.layers, per_layer)
    # the median step: a burst of other work on a shared machine moves one step, not it
    step_s = statistics.median(times)
    return Decoded(logits=torch.stack(logits, dim=1), step_s=step_s, kv_bytes=peak // s,
                   keys_attended=attended / steps)  # fmt: skip


def decode_groups(
    model: PreTrainedModel,
    pre: Prefilled,
    plans: Sequence[tuple[list[int | None], bool]],
    live: Sequence[LiveBudget | None] = (),
) -> list[Decoded]:
    """:func:`decode` of every ``(per_layer, heavy)`` plan at once, the plans' sequences
    sharing each forward (kcops.lab.sweepbatch); no timing. A plan with a
    :class:`LiveBudget` in ``live`` (same order) takes its budgets from it at every
    step, after feeding it the step's weights (``kc_live``)."""
    s, steps = pre.feed.shape
    g = len(plans)
    lives = list(live) + [None] * (g - len(live))
    layers = [
        [_kept_layer(pre, i, per[i], heavy) for per, heavy in plans] for i in range(len(pre.kv))
    ]
    cache, grouped = grouped_cache(model.config, layers, s)
    heads = model.config.num_attention_heads // model.config.num_key_value_heads
    for layer in grouped:
        layer.track = {x for x, lb in enumerate(lives) if lb is not None}
    per_now = [list(per) for per, _ in plans]
    feed = pre.feed.repeat(g, 1)  # group-major: (G*S, E)
    logits: list[torch.Tensor] = []
    peak = [0] * g
    attended = [0.0] * g
    kw = _cache_kw(model)
    with torch.inference_mode(), use_policy(DENSE), use_kept(cache):
        for j in range(steps):
            pos = torch.full((g * s, 1), pre.start + j)
            out = model(
                input_ids=feed[:, j : j + 1], position_ids=pos, use_cache=True, **{kw: cache}
            )
            logits.append(out.logits[:, -1].float())
            for x in range(g):
                peak[x] = max(peak[x], group_nbytes(grouped, x))
                attended[x] += group_keys(grouped, x)
            for x, lb in enumerate(lives):
                if lb is not None:
                    observe_step(lb, grouped, x, heads)
                    per_now[x] = list(lb.step())
            for i, layer in enumerate(grouped):
                layer.evict([per[i] for per in per_now])
    stacked = torch.stack(logits, dim=1)  # (G*S, E, V)
    return [
        Decoded(logits=stacked[x * s : (x + 1) * s], kv_bytes=peak[x] // s,
                keys_attended=attended[x] / steps, live=None if lb is None else lb.evidence())
        for x, lb in enumerate(lives)
    ]  # fmt: skip


def score_row(
    policy: str,
    n: int | None,
    context: int,
    res: Decoded,
    pre: Prefilled,
    full_pred: torch.Tensor | None,
    per_layer: list[int | None],
) -> tuple[Row, torch.Tensor]:
    logits = res["logits"]
    pred = logits.argmax(-1)
    nll = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), pre.target.reshape(-1)
    )
    positions = pred.numel()
    agree = pred if full_pred is None else full_pred
    row = Row(
        policy=policy,
        n=n,
        context=context,
        accuracy=float((pred == pre.target).float().mean()),
        accuracy_delta_se=paired_se(pred, agree, pre.target),
        accuracy_delta_se_seq=paired_se_by_sequence(pred, agree, pre.target),
        agreement=float((pred == agree).float().mean()),
        perplexity=float(math.exp(float(nll))),
        latency_s_per_token=res["step_s"],
        tokens_per_s=pre.feed.shape[0] / res["step_s"] if res["step_s"] > 0 else 0.0,
        kv_bytes=int(res["kv_bytes"]),
        keys_attended=float(res["keys_attended"]),
        positions=positions,
        budgets=per_layer,
        live=res.get("live"),
    )
    return row, pred


def paired_se(pred: torch.Tensor, full_pred: torch.Tensor, target: torch.Tensor) -> float:
    """Standard error of the accuracy difference with full attention, paired by position:
    d_i = [pred_i = target_i] - [full_i = target_i], SE = sd(d) / sqrt(positions). Only
    positions where exactly one of the two is right move it."""
    d = ((pred == target).double() - (full_pred == target).double()).flatten()
    return float(d.std() / math.sqrt(d.numel())) if d.numel() > 1 else 0.0


def paired_se_by_sequence(
    pred: torch.Tensor, full_pred: torch.Tensor, target: torch.Tensor
) -> float | None:
    """The paired difference's standard error over the S sequences' mean differences
    (a cluster-robust estimate: a sequence's positions share its text); None below 2."""
    d = (pred == target).double() - (full_pred == target).double()  # (S, E)
    if d.dim() != 2 or d.shape[0] < 2:
        return None
    return float(d.mean(dim=1).std() / math.sqrt(d.shape[0]))


def sweep_context(
    model: PreTrainedModel, seqs: torch.Tensor, *, ns: Sequence[int], policies: Sequence[str],
    eval_tokens: int, done: dict[str, Row], on_row: Callable[[Row], None],
    tick: Callable[[], object] = lambda: None, groups_per_pass: int = GROUPS_PER_PASS,
    kc_rows: dict[int, dict[int, dict[float, list[int]]]] | None = None,
) -> list[Row]:  # fmt: skip
    """All rows of one context (full attention first); rows in ``done`` are reused.

    Up to ``groups_per_pass`` rows (full attention in the first pass, always: the
    others' agreement needs its tokens) decode in one batch (:func:`decode_groups`);
    then each new row's speed is timed on its own. ``kc_rows``, when given, receives the
    prefill's K_p rows (kcops.lab.sweepcal) under the context, so that the
    calibration needs no second prefill."""
    context = seqs.shape[1] - 1
    jobs = [(p, n) for p in policies for n in ns]
    full_key = row_key(FULL, None, context)
    wanted = [full_key] + [row_key(p, n, context) for p, n in jobs]
    for _ in (k for k in wanted if k in done):
        tick()
    if all(k in done for k in wanted):
        return [done[k] for k in wanted]
    from kcops.lab.sweepcal import P_GRID

    pre = prefill(model, seqs, eval_tokens, p_grid=P_GRID if kc_rows is not None else ())
    if kc_rows is not None:
        kc_rows[context] = pre.rows
    layers = len(pre.kv)
    todo = [(p, n) for p, n in jobs if row_key(p, n, context) not in done]
    pressed = [(p, n) for p, n in todo if is_kvpress(p)]
    plans: list[tuple[str, int | None, list[int | None], bool]] = [
        (FULL, None, [None] * layers, True)
    ]
    plans += [(p, n, budgets(p, n, layers, context, pre.kp), p != "window")
              for p, n in todo if (p, n) not in pressed]  # fmt: skip
    measured: dict[str, Row] = {}
    full_pred: torch.Tensor | None = None
    for start in range(0, len(plans), groups_per_pass):
        chunk = plans[start : start + groups_per_pass]
        lives = [
            LiveBudget(list(per), context) if p == "kc_live" and any(per) else None
            for p, _, per, _ in chunk
        ]
        results = decode_groups(model, pre, [(per, heavy) for _, _, per, heavy in chunk], lives)
        for (policy, n, per, heavy), res in zip(chunk, results, strict=True):
            if policy == FULL and full_key in done:  # recomputed only for its tokens
                full_pred = res["logits"].argmax(-1)
                continue
            # speed of the row on its own: the median of its first TIMED_STEPS steps
            res["step_s"] = decode(model, pre, per, heavy, steps=TIMED_STEPS)["step_s"]
            row, pred = score_row(policy, n, context, res, pre, full_pred, per)
            if policy == FULL:
                full_pred = pred
            measured[row.key] = row
            on_row(row)
            tick()
    assert full_pred is not None
    for row in press_rows(model, seqs, pre, pressed, full_pred):
        measured[row.key] = row
        on_row(row)
        tick()
    return [measured.get(k) or done[k] for k in wanted]


def press_rows(
    model: PreTrainedModel, seqs: torch.Tensor, pre: Prefilled,
    pressed: Sequence[tuple[str, int]], full_pred: torch.Tensor,
) -> Iterable[Row]:  # fmt: skip
    """The kvpress policies' rows (kcops.lab.presses): the same sequences, decode
    positions and N, scored here against this sweep's full attention."""
    context = seqs.shape[1] - 1
    for (policy, n), dec, kept, meta in press_decoded(model, seqs, pre, pressed, full_pred):
        row, _ = score_row(policy, n, context, dec, pre, full_pred, kept)
        row.kvpress = meta
        yield row


def press_decoded(
    model: PreTrainedModel, seqs: torch.Tensor, pre: Prefilled,
    pressed: Sequence[tuple[str, int]], full_pred: torch.Tensor | None = None,
) -> Iterable[tuple[tuple[str, int], Decoded, list[int | None], dict[str, object]]]:  # fmt: skip
    """Each kvpress plan decoded by kvpress's side on ``seqs`` from ``pre.start`` (with
    ``per_layer``'s K(C) split for ``kvpress:kc``): its logits and costs, its per-layer
    keys kept and what to record (the sequences' hash, versions and, given
    ``full_pred``, how often the side's own full attention agrees with it)."""
    if not pressed:
        return
    from kcops.lab.presses import PressError, job, run

    layers = len(pre.kv)
    jobs = [job(p, n, pre.start, budgets("per_layer", n, layers, pre.start, pre.kp))
            for p, n in pressed]  # fmt: skip
    try:
        results = run(model, seqs, pre.start, jobs)
        side_full = next(results)["logits"].argmax(-1)
        same = None if full_pred is None else float((side_full == full_pred).float().mean())
        for plan, res in zip(pressed, results, strict=True):
            dec = Decoded(logits=res["logits"], step_s=res["step_s"], kv_bytes=res["kv_bytes"],
                          keys_attended=res["keys_attended"])  # fmt: skip
            meta: dict[str, object] = {"sha": res["sha"], "versions": res["versions"],
                                       "full_agreement": same}  # fmt: skip
            yield plan, dec, list[int | None](res["kept"]), meta
    except PressError as exc:
        raise SweepError(str(exc)) from None


class Recommendation(TypedDict, total=False):
    """One context's line of ``recommendation.json``; without a budget that stays within
    the tolerance only context, policy None, n None and full attention's row."""

    context: int
    policy: str | None
    n: int | None
    full: dict[str, object]
    accuracy_delta_points: float
    accuracy_delta_se_points: float
    within_noise: bool
    agreement: float
    kv_bytes_saved_ratio: float
    tokens_per_s_ratio: float
    positions: int
    kc_coverage: Coverage  # the live calibration


def recommend(rows: Sequence[Row], tolerance_points: float) -> list[Recommendation]:
    """Per context: the smallest KV budget whose accuracy loss is within ``tolerance_points``
    (percentage points) of full attention's *with confidence* (Δ − 2 SE ≥ −tolerance,
    SE the larger of the paired standard errors by position and by sequence:
    :attr:`Row.delta_se`), and what it saves. Where no row is confident, the
    smallest whose point estimate is within the tolerance, marked ``within_noise``
    (the positions cannot tell its loss from a larger one)."""
    out: list[Recommendation] = []
    for context in sorted({r.context for r in rows}):
        ctx = [r for r in rows if r.context == context]
        full = next((r for r in ctx if r.policy == FULL), None)
        if full is None:
            continue
        tol = tolerance_points / 100.0
        budgeted = [r for r in ctx if r.policy != FULL]
        confident = [r for r in budgeted if r.accuracy - full.accuracy - 2 * r.delta_se >= -tol]
        ok = confident or [r for r in budgeted if r.accuracy >= full.accuracy - tol]
        if not ok:
            out.append(Recommendation(context=context, policy=None, n=None, full=full.as_json()))
            continue
        best = min(ok, key=lambda r: (r.kv_bytes, r.n or 0, policy_rank(r.policy)))
        delta = 100.0 * (best.accuracy - full.accuracy)
        se = 100.0 * best.delta_se
        out.append(
            Recommendation(
                context=context,
                policy=best.policy,
                n=best.n,
                accuracy_delta_points=delta,
                accuracy_delta_se_points=se,
                within_noise=not confident,
                agreement=best.agreement,
                kv_bytes_saved_ratio=1.0 - best.kv_bytes / full.kv_bytes,
                tokens_per_s_ratio=best.tokens_per_s / full.tokens_per_s,
                positions=best.positions,
            )
        )
    return out
