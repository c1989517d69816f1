"""The continuous-batching loop: one model thread, a queue in, events out.

Each iteration admits the waiting requests, prefills each one (reusing its
cached prefix), groups the new ones into *cohorts* of the same path and
similar prompt length (left-padded into one KV batch), then runs one decode
step for every live cohort. New requests therefore start while older cohorts
are still decoding. Finished rows leave their cohort at once.

Both paths prefill with full attention. The optimized path then keeps in its
KV cache only what the top-N budget can use (kcops.kernels.kvkeep: sinks, a
recent window and heavy hitters per layer and KV head; dense layers whole),
so its KV bytes and decode reads scale with N, not with the context.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from kcops.kernels.attribution import RequestKC, attribute
from kcops.kernels.kvkeep import (
    LayerKV,
    cache_nbytes,
    capture_scores,
    compress_request,
    evict,
    kept_cache,
    use_kept,
)
from kcops.kernels.topn import DENSE, TopNPolicy, use_policy
from kcops.tenant import OWN
from kcops.worker.cache import KV, PrefixCache
from kcops.worker.control import BASE, OPTIMIZED, Control
from kcops.worker.faults import Faults
from kcops.worker.metrics import WorkerMetrics

if TYPE_CHECKING:
    from transformers import Cache, PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger("kcops.worker")
MAX_COHORT = 8
# The agreement gauge covers the last this many shadow checks: a lifetime ratio
# would hardly move after a day of traffic, and KcopsAccuracyDrop compares its
# recent average with its baseline.
SHADOW_WINDOW = 32


@dataclass
class Event:
    kind: str  # "delta" | "done" | "error"
    text: str = ""
    finish_reason: str | None = None
    usage: dict[str, int] | None = None
    tokens: int = 0  # generated tokens when emitted: which logprobs a delta covers


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    emit: Callable[[Event], None]
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    arrival_s: float = 0.0
    cancelled: bool = False
    route: str = BASE
    generated: list[int] = field(default_factory=list)
    sent_chars: int = 0
    cached_tokens: int = 0
    top_n: int | None = None  # default N this request ran under (None: dense)
    logprobs: int | None = None  # record the top-k logprobs of each sampled token
    token_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    last_token_s: float | None = None
    tenant: str = "none"  # bounded label (kcops.tenant)
    kc: RequestKC = field(default_factory=RequestKC)  # the probe's K(C) of its rows
    _gen: torch.Generator | None = None


@dataclass
class Cohort:
    route: str
    reqs: list[GenRequest]
    cache: Any  # DynamicCache, batch = len(reqs)
    mask: torch.Tensor  # (B, L) 1 = real token
    pos: torch.Tensor  # (B,) next position per row

    @property
    def kv_bytes(self) -> int:
        return cache_nbytes(self.cache)


def policy_namespace(model_name: str, policy: TopNPolicy) -> str:
    """Cache namespace: KV computed under different attention differs."""
    if policy.top_n is None and not policy.top_n_by_layer:
        return f"{model_name}|dense"
    by_layer = sorted(policy.top_n_by_layer.items())
    return f"{model_name}|topn:{policy.top_n}:{by_layer}:{sorted(policy.dense_layers)}"


def served_logprobs(
    logits: torch.Tensor, token: int, top: int
) -> tuple[int, float, list[tuple[int, float]]]:
    """The sampled token's log-probability under the served (unscaled) logits, and the top-k."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    best = torch.topk(lp, top) if top > 0 else None
    tops = (
        [] if best is None else list(zip(best.indices.tolist(), best.values.tolist(), strict=True))
    )
    return token, float(lp[token]), tops


class BatchEngine:
    """The model thread: requests batched into cohorts, generated token by token."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_name: str,
        control: Control,
        cache: PrefixCache,
        faults: Faults,
        metrics: WorkerMetrics,
        shadow_fraction: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.model, self.tok = model, tokenizer
        self.model_name = model_name
        self.control, self.cache, self.faults, self.metrics = control, cache, faults, metrics
        self.shadow_fraction = shadow_fraction
        self.clock = clock
        self.rng = rng or random.Random(0)
        self.cache_lock = threading.Lock()
        self.shadow_checks = 0
        self.max_batch_seen = 0  # largest decode batch so far (evidence of batching)
        self.shadow_recent: deque[bool] = deque(maxlen=SHADOW_WINDOW)
        self.kv_bytes = 0  # KV held by live cohorts, after the last iteration
        self.kv_bytes_peak = 0
        self._queue: queue.Queue[GenRequest] = queue.Queue()
        self._cohorts: list[Cohort] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kcops-model", daemon=True)
        # transformers >= 5.2x renamed ``past_key_values`` to ``cache``.
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._last_logits = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.eos_ids = (
            {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
        )

    # -- public, any thread --------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self.faults.unhung.set()
        self._thread.join(timeout_s)

    def submit(self, req: GenRequest) -> None:
        req.arrival_s = self.clock()
        self._queue.put(req)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    @property
    def running(self) -> int:
        return sum(len(c.reqs) for c in self._cohorts)

    @property
    def shadow_agreement(self) -> float | None:
        """Share of the last SHADOW_WINDOW shadow checks that agreed; None before the first."""
        recent = self.shadow_recent
        return sum(recent) / len(recent) if recent else None

    # -- model thread --------------------------------------------------------
    def _run(self) -> None:
        with torch.inference_mode():
            while not self._stop.is_set():
                if not self.faults.unhung.wait(0.2):
                    continue  # hung by a fault drill: no progress until cleared
                try:
                    self.faults.tick(self.clock())  # a memory ramp drill grows here
                    self._iteration()
                except Exception:  # a bug must not kill the loop silently
                    log.exception("model loop iteration failed")

    def _admit(self) -> list[GenRequest]:
        new: list[GenRequest] = []
        try:
            timeout = None if not self._cohorts else 0.0
            first = self._queue.get(timeout=0.1) if timeout is None else self._queue.get_nowait()
            new.append(first)
            while True:
                new.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        return new

    def _iteration(self) -> None:
        new = [r for r in self._admit() if not self._abort_if_cancelled(r)]
        prefilled: list[tuple[GenRequest, list[LayerKV]]] = []
        for req in new:
            try:
                kv = self._prefill(req)
            except Exception as exc:
                log.exception("prefill failed")
                req.emit(Event("error", text=f"prefill failed: {exc}"))
                continue
            if kv is not None:
                prefilled.append((req, kv))
        self._form_cohorts(prefilled)
        step_tokens = sum(len(r.prompt_ids) for r in new) + sum(len(c.reqs) for c in self._cohorts)
        for cohort in list(self._cohorts):
            try:
                self._decode_step(cohort)
            except Exception as exc:
                log.exception("decode step failed")
                for req in cohort.reqs:
                    req.emit(Event("error", text=f"decode failed: {exc}"))
                cohort.reqs = []
            if not cohort.reqs:
                self._cohorts.remove(cohort)
        self.kv_bytes = sum(c.kv_bytes for c in self._cohorts)
        self.kv_bytes_peak = max(self.kv_bytes_peak, self.kv_bytes)
        if step_tokens:
            self.metrics.iteration_tokens.observe(step_tokens)

    def _abort_if_cancelled(self, req: GenRequest) -> bool:
        if req.cancelled:
            req.emit(Event("done", finish_reason="abort", usage=self._usage(req)))
        return req.cancelled

    def _forward(self, policy: TopNPolicy, kv_cache: Cache | None = None, **kwargs: object) -> Any:
        if kv_cache is not None:
            kwargs[self._cache_kw] = kv_cache
        with use_policy(policy), use_kept(kv_cache):
            return self.model(use_cache=True, **kwargs)

    def _dense_cache(self, kv: KV) -> Any:
        """A one-row transformers cache holding every key of ``kv``."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer, (k, v) in enumerate(kv):
            cache.update(k[None], v[None], layer)
        return cache

    def _prefill(self, req: GenRequest) -> list[LayerKV] | None:
        if self.faults.latency_ms > 0:
            time.sleep(self.faults.latency_ms / 1000.0)
        ids = req.prompt_ids
        req.route = self.control.route(len(ids))
        self.metrics.routed(req.route)
        budget = self.control.policy(req.route)
        req.top_n = budget.top_n
        # Prefill is full attention on both paths: the budget applies to what is kept.
        policy = TopNPolicy(inject_nan=self.faults.nan)
        ns = policy_namespace(self.model_name, DENSE)
        now = self.clock()
        with self.cache_lock:
            n_cached, cached = self.cache.lookup(ids, ns, now)
        self.metrics.prefix_queries.inc(len(ids))
        self.metrics.prefix_hits.inc(n_cached)
        self.metrics.prompt_tokens.inc(len(ids))
        req.cached_tokens = n_cached
        kv_cache = self._dense_cache(cached)  # its layers: DynamicLayer
        # Logits of the last position only (at 8k tokens, all of them are 1.6 GB); the
        # heavy-hitter scores only for the path that keeps a budget.
        with (
            capture_scores() if req.route == OPTIMIZED else contextlib.nullcontext() as cap,
            attribute((req.kc,)),
        ):
            out = self._forward(
                policy, kv_cache, input_ids=torch.tensor([ids[n_cached:]]), **self._last_logits
            )
        logits = out.logits[0, -1].float()
        scores = cap.scores if cap is not None else {}
        kv: KV = [(lay.keys[0], lay.values[0]) for lay in kv_cache.layers]
        with self.cache_lock:
            self.cache.insert(ids, ns, kv, self.clock())
        kept = [
            compress_request(k, v, scores.get(i), budget.n_for_layer(i))
            if req.route == OPTIMIZED
            else LayerKV(k, v, None, None, len(ids))
            for i, (k, v) in enumerate(kv)
        ]
        if req.seed is not None:
            req._gen = torch.Generator().manual_seed(req.seed)
        token = self._sample(logits, req)
        if req.route == OPTIMIZED and self.rng.random() < self.shadow_fraction:
            self._shadow(kv, kept, token, len(ids))
        self.metrics.ttft.observe(self.clock() - req.arrival_s)
        if self._accept(req, token):
            return kept
        return None

    def _shadow(self, full: KV, kept: list[LayerKV], token: int, pos: int) -> None:
        """One decode step on the full KV and on the kept KV: count greedy agreement."""
        choices = []
        for cache in (self._dense_cache(full), self._batch_cache([kept])[0]):
            out = self._forward(
                DENSE, cache, input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[pos]])
            )
            choices.append(int(torch.nan_to_num(out.logits[0, -1].float()).argmax()))
        self.shadow_checks += 1
        self.shadow_recent.append(choices[0] == choices[1])
        self.metrics.shadow_checks.inc()

    def _sample(self, logits: torch.Tensor, req: GenRequest) -> int:
        logits = torch.nan_to_num(logits, nan=0.0, posinf=1e4, neginf=-1e4)
        token = self._pick(logits, req)
        if req.logprobs is not None:
            req.token_logprobs.append(served_logprobs(logits, token, req.logprobs))
        return token

    @staticmethod
    def _pick(logits: torch.Tensor, req: GenRequest) -> int:
        if req.temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits / req.temperature, dim=-1)
        if req.top_p < 1.0:
            sorted_p, idx = probs.sort(descending=True)
            cut = sorted_p.cumsum(0) - sorted_p > req.top_p
            sorted_p[cut] = 0.0
            probs = torch.zeros_like(probs).scatter_(0, idx, sorted_p)
        return int(torch.multinomial(probs, 1, generator=req._gen))

    def _accept(self, req: GenRequest, token: int) -> bool:
        """Append a token, emit text, finish when due. True while the request goes on."""
        if req.cancelled:
            self._context_done(req)
            req.emit(Event("done", finish_reason="abort", usage=self._usage(req)))
            return False
        now = self.clock()
        if req.last_token_s is not None:
            self.metrics.itl.observe(now - req.last_token_s)
        req.last_token_s = now
        is_eos = token in self.eos_ids
        if not is_eos:
            req.generated.append(token)
            self.metrics.generation_tokens.inc()
        text = str(self.tok.decode(req.generated, skip_special_tokens=True))
        finish: str | None = "stop" if is_eos else None
        for s in req.stop:
            at = text.find(s)
            if at >= 0:
                text, finish = text[:at], "stop"
        if finish is None and len(req.generated) >= req.max_tokens:
            finish = "length"
        if finish is None:
            # Hold back a partial stop string and an incomplete UTF-8 character.
            hold = max((len(s) - 1 for s in req.stop), default=0)
            visible = len(text) - hold
            while visible > req.sent_chars and text[visible - 1] == "\ufffd":
                visible -= 1
        else:
            visible = len(text)
        if visible > req.sent_chars:
            req.emit(Event("delta", text=text[req.sent_chars : visible], tokens=len(req.generated)))
            req.sent_chars = visible
        if finish is not None:
            self.metrics.e2e.observe(self.clock() - req.arrival_s)
            self.metrics.success(finish)
            self._context_done(req)
            req.emit(Event("done", finish_reason=finish, usage=self._usage(req)))
            return False
        return True

    def _context_done(self, req: GenRequest) -> None:
        # Full context: what the request's last step attended (prompt + generated tokens).
        # The agent's canary (tenant OWN) is served, never counted for a tenant.
        full = len(req.prompt_ids) + len(req.generated)
        if req.tenant != OWN:
            self.metrics.request_context(req.tenant, full, req.kc.mean)

    @staticmethod
    def _usage(req: GenRequest) -> dict[str, int]:
        p, c = len(req.prompt_ids), len(req.generated)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _form_cohorts(self, prefilled: list[tuple[GenRequest, list[LayerKV]]]) -> None:
        groups: dict[tuple[str, int], list[tuple[GenRequest, list[LayerKV]]]] = {}
        for req, kv in prefilled:
            groups.setdefault((req.route, len(req.prompt_ids).bit_length()), []).append((req, kv))
        for (route, _), members in groups.items():
            for start in range(0, len(members), MAX_COHORT):
                self._cohorts.append(self._cohort(route, members[start : start + MAX_COHORT]))

    def _cohort(self, route: str, members: list[tuple[GenRequest, list[LayerKV]]]) -> Cohort:
        reqs = [r for r, _ in members]
        cache, lengths = self._batch_cache([kv for _, kv in members])
        width = max(lengths)
        mask = torch.zeros(len(members), width, dtype=torch.long)
        for row, n in enumerate(lengths):
            mask[row, width - n :] = 1
        return Cohort(route, reqs, cache, mask, torch.tensor(lengths))

    def _batch_cache(self, rows: list[list[LayerKV]]) -> tuple[Any, list[int]]:
        """Left-pad the rows' per-layer KV into one cache; returns it and the prompt lengths."""
        lengths = [kv[0].logical for kv in rows]
        width = max(lengths)
        cache = kept_cache(self.model.config, len(rows[0]))
        for layer, kl in enumerate(cache.layers):
            parts = [kv[layer] for kv in rows]
            t = max(p.keys.shape[-2] for p in parts)
            pad = [(0, 0, t - p.keys.shape[-2], 0) for p in parts]
            pad_fn = torch.nn.functional.pad
            keys = torch.stack([pad_fn(p.keys, q) for p, q in zip(parts, pad, strict=True)])
            values = torch.stack([pad_fn(p.values, q) for p, q in zip(parts, pad, strict=True)])
            kl.update(keys, values)
            kl.logical = width
            if any(p.valid is not None for p in parts):
                valid, score = [], []
                for p in parts:
                    n = p.keys.shape[-2]
                    v = (
                        p.valid
                        if p.valid is not None
                        else torch.ones(p.keys.shape[:2], dtype=torch.bool)
                    )
                    sc = p.score if p.score is not None else torch.zeros(p.keys.shape[:2])
                    valid.append(pad_fn(v, (t - n, 0), value=False))
                    score.append(pad_fn(sc.float(), (t - n, 0)))
                kl.valid, kl.score = torch.stack(valid), torch.stack(score)
        return cache, lengths

    def _decode_step(self, cohort: Cohort) -> None:
        if self.faults.token_delay_ms > 0:  # a drill: every decoded token comes later
            time.sleep(self.faults.token_delay_ms / 1000.0)
        reqs = cohort.reqs
        self.max_batch_seen = max(self.max_batch_seen, len(reqs))
        last = torch.tensor([[r.generated[-1]] for r in reqs])
        mask = torch.cat([cohort.mask, torch.ones(len(reqs), 1, dtype=torch.long)], dim=1)
        policy = self.control.policy(cohort.route, inject_nan=self.faults.nan)
        with attribute([r.kc for r in reqs]):  # batch entry i is reqs[i]
            out = self._forward(
                policy,
                cohort.cache,
                input_ids=last,
                attention_mask=mask,
                position_ids=cohort.pos[:, None],
            )
        cohort.mask, cohort.pos = mask, cohort.pos + 1
        if cohort.route == OPTIMIZED:  # H2O: cut back to N after each step; a lowered N too
            budget = self.control.policy(OPTIMIZED)
            layers = cohort.cache.layers
            evict(layers, [budget.n_for_layer(i) for i in range(len(layers))])
        keep = [
            i
            for i, req in enumerate(reqs)
            if self._accept(req, self._sample(out.logits[i, -1].float(), req))
        ]
        if len(keep) < len(reqs):
            idx = torch.tensor(keep, dtype=torch.long)
            for layer in cohort.cache.layers:
                layer.batch_select_indices(idx)
            cohort.mask, cohort.pos = cohort.mask[idx], cohort.pos[idx]
            cohort.reqs = [reqs[i] for i in keep]
