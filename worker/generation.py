"""One API request as several engine requests: each prompt times ``n`` choices.

The engine runs one :class:`GenRequest` per choice (so they batch together like
separate requests, and TTFT, inter-token and request latency are observed per
choice, exactly as for single completions). Their events come back on one queue
tagged with the choice index.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from kcops.worker.engine import BatchEngine, Event, GenRequest
from kcops.worker.protocol import ApiError

# (token id, logprob, [(top token id, logprob), ...]) recorded by the engine per sampled token
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


@dataclass
class Sampling:
    """What every choice of one request shares."""

    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    seed: int | None
    logprobs: int | None = None  # top-k to record per token; None: none


@dataclass
class Choice:
    index: int
    prompt_ids: list[int]
    req: GenRequest
    text: list[str] = field(default_factory=list)
    logprobs_sent: int = 0  # tokens whose logprobs went out already (streaming)
    finish_reason: str | None = None
    usage: dict[str, int] | None = None


def check_context(prompts: list[list[int]], max_tokens: int | None, context: int) -> int:
    """The completion budget, checked against the context length (vLLM's message)."""
    longest = max(len(p) for p in prompts)
    budget = max_tokens if max_tokens is not None else context - longest
    if budget < 1 or longest + budget > context:
        raise ApiError(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{longest + max(budget, 1)} tokens ({longest} in the prompt, {max(budget, 1)} for "
            "the completion). Please reduce the length.",
            param="max_tokens",
        )
    return budget


def _emitter(
    loop: asyncio.AbstractEventLoop, events: asyncio.Queue[tuple[int, Event]], index: int
) -> Callable[[Event], None]:
    def emit(ev: Event) -> None:
        # At shutdown the server's loop closes before the model thread has finished
        # its batch; its last events have no reader left to lose.
        if not loop.is_closed():
            try:
                loop.call_soon_threadsafe(events.put_nowait, (index, ev))
            except RuntimeError:
                pass

    return emit


class Generation:
    """The choices of one request, submitted together; events in arrival order."""

    def __init__(
        self,
        engine: BatchEngine,
        prompts: list[list[int]],
        n: int,
        s: Sampling,
        tenant: str = "none",
    ) -> None:
        self.engine, self.n = engine, n
        self._events: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self.choices: list[Choice] = []
        for p, ids in enumerate(prompts):
            for j in range(n):
                index = p * n + j
                req = GenRequest(
                    prompt_ids=ids,
                    max_tokens=s.max_tokens,
                    emit=_emitter(loop, self._events, index),
                    temperature=s.temperature,
                    top_p=s.top_p,
                    stop=s.stop,
                    # n samples of one seeded request differ, and are reproducible.
                    seed=None if s.seed is None else (s.seed + j) % 2**63,
                    logprobs=s.logprobs,
                    tenant=tenant,
                )
                self.choices.append(Choice(index, ids, req))

    def submit(self) -> None:
        for c in self.choices:
            self.engine.submit(c.req)

    def cancel(self) -> None:
        for c in self.choices:
            c.req.cancelled = True

    async def events(self) -> AsyncIterator[tuple[Choice, Event]]:
        """Each choice's events until every choice is done; an engine error is raised."""
        live = len(self.choices)
        while live:
            index, ev = await self._events.get()
            choice = self.choices[index]
            if ev.kind == "error":
                raise GenerationFailed(ev.text)
            if ev.kind == "delta":
                choice.text.append(ev.text)
            else:
                choice.finish_reason, choice.usage = ev.finish_reason, ev.usage
                live -= 1
            yield choice, ev

    def usage(self) -> dict[str, int]:
        """Prompt tokens once per prompt (n choices share it), completion tokens summed."""
        prompt = sum(len(c.prompt_ids) for c in self.choices if c.index % self.n == 0)
        completion = sum((c.usage or {}).get("completion_tokens", 0) for c in self.choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def kcops_info(self) -> dict[str, object]:
        """Our extension: how the first choice was served (route, N, prefix-cache hit)."""
        req = self.choices[0].req
        return {"route": req.route, "top_n": req.top_n, "cached_tokens": req.cached_tokens}


class GenerationFailed(Exception):
    """The model thread reported an error for a choice."""


def new_logprobs(choice: Choice, upto: int | None) -> list[TokenLogprob]:
    """Logprob entries of the tokens not sent yet, up to ``upto`` generated tokens."""
    recorded = choice.req.token_logprobs
    end = len(recorded) if upto is None else min(upto, len(recorded))
    out = recorded[choice.logprobs_sent : end]
    choice.logprobs_sent = max(choice.logprobs_sent, end)
    return out
