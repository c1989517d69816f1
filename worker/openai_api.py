"""The OpenAI endpoints: ``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``.

Both generation endpoints go the same way: validate the body
(:mod:`kcops.worker.protocol`), turn it into prompts of token ids, run one engine
request per choice (:mod:`kcops.worker.generation`), and answer whole or as
server-sent events in the shape of :mod:`kcops.worker.shapes`. Routing (short to
base, long to optimized), the probe, shadow checks and metrics all happen in the
engine, per choice, so chat is counted exactly as completions.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kcops.worker.generation import (
    Generation,
    GenerationFailed,
    Sampling,
    check_context,
    new_logprobs,
)
from kcops.worker.protocol import (
    MAX_CHOICES,
    ApiError,
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    parse,
)
from kcops.worker.shapes import AnswerShape, ChatShape, CompletionShape
from kcops.worker.state import WorkerState, hang_gate, state_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# For a tokenizer without a chat template: ChatML, as SmolLM2's own.
SIMPLE_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
GREEDY_BELOW = 1e-5  # softmax(logits / T) overflows below this: it is greedy anyway


async def models(request: web.Request) -> web.Response:
    state = state_of(request)
    card = {
        "id": state.model_name,
        "object": "model",
        "created": 0,
        "owned_by": "kcops",
        "root": state.model_name,
        "max_model_len": state.context_tokens,
    }
    return web.json_response({"object": "list", "data": [card]})


async def _admit(request: web.Request) -> WorkerState:
    state = state_of(request)
    await hang_gate(state)
    if not state.admitting:
        raise ApiError("the worker is draining: not admitting new requests", 503)
    return state


def _check_model(state: WorkerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise ApiError(
            f"The model `{model}` does not exist: this worker serves `{state.model_name}`.",
            404,
            param="model",
            code="model_not_found",
        )


def _tokenize(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    ids = list(tok(text, add_special_tokens=False).input_ids)
    if not ids:
        raise ApiError("'prompt' tokenizes to no tokens", param="prompt")
    return ids


def completion_prompts(prompt: Any, tok: PreTrainedTokenizerBase) -> list[list[int]]:
    """One list of token ids per prompt: a string, strings, token ids, lists of them."""
    if isinstance(prompt, str):
        prompts = [_tokenize(tok, prompt)]
    elif isinstance(prompt[0], str):
        prompts = [_tokenize(tok, p) for p in prompt]
    elif isinstance(prompt[0], int):
        prompts = [list(prompt)]
    else:
        prompts = [list(p) for p in prompt]
    vocab = len(tok)
    if any(t >= vocab for p in prompts for t in p):
        raise ApiError(f"token ids in 'prompt' must be integers in [0, {vocab})", param="prompt")
    return prompts


def render_chat(tok: PreTrainedTokenizerBase, messages: list[ChatMessage]) -> list[int]:
    """The conversation through the model's own chat template, ready for the assistant."""
    turns = [
        {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        for m in messages
    ]
    template = getattr(tok, "chat_template", None) or SIMPLE_CHAT_TEMPLATE
    try:
        text = tok.apply_chat_template(
            turns, chat_template=template, tokenize=False, add_generation_prompt=True
        )
    except Exception as exc:  # a template may refuse a conversation (jinja raise_exception)
        raise ApiError(
            f"the chat template refused 'messages': {exc}"[:300], param="messages"
        ) from None
    return _tokenize(tok, str(text))


def _sampling(
    body: CompletionRequest | ChatCompletionRequest, budget: int, logprobs: int | None
) -> Sampling:
    temperature = 0.0 if body.temperature < GREEDY_BELOW else body.temperature
    return Sampling(
        max_tokens=budget,
        temperature=temperature,
        top_p=body.top_p,
        stop=body.stops(),
        seed=body.seed,
        logprobs=logprobs,
    )


async def completions(request: web.Request) -> web.StreamResponse:
    state = await _admit(request)
    body = parse(CompletionRequest, await request.read())
    _check_model(state, body.model)
    tok = state.engine.tok
    prompts = completion_prompts(body.prompt, tok)
    if len(prompts) * body.n > MAX_CHOICES:
        raise ApiError(f"prompts x n must be at most {MAX_CHOICES}", param="n")
    if body.echo and body.logprobs is not None:
        raise ApiError("'echo' with 'logprobs' is not supported (no prompt logprobs)", param="echo")
    budget = check_context(prompts, body.max_tokens, state.context_tokens)
    sampling = _sampling(body, budget, body.logprobs)
    tenant = state.tenants.of_request(request.headers, body.user)
    gen = Generation(state.engine, prompts, body.n, sampling, tenant)
    echo = {}
    if body.echo:
        texts = [str(tok.decode(p)) for p in prompts]
        echo = {c.index: texts[c.index // body.n] for c in gen.choices}
    shape = CompletionShape(tok, body.logprobs is not None, echo)
    return await _respond(request, state, gen, shape, body.stream, body.include_usage())


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = await _admit(request)
    body = parse(ChatCompletionRequest, await request.read())
    _check_model(state, body.model)
    if body.top_logprobs and not body.logprobs:
        raise ApiError("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
    prompt = render_chat(state.engine.tok, body.messages)
    budget = check_context([prompt], body.token_budget(), state.context_tokens)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    sampling = _sampling(body, budget, logprobs)
    tenant = state.tenants.of_request(request.headers, body.user)
    gen = Generation(state.engine, [prompt], body.n, sampling, tenant)
    shape = ChatShape(state.engine.tok, body.logprobs)
    return await _respond(request, state, gen, shape, body.stream, body.include_usage())


async def _respond(
    request: web.Request,
    state: WorkerState,
    gen: Generation,
    shape: AnswerShape,
    stream: bool,
    include_usage: bool,
) -> web.StreamResponse:
    rid, created = f"{shape.id_prefix}{uuid.uuid4().hex}", int(time.time())
    head = {"id": rid, "created": created, "model": state.model_name}
    state.in_flight += 1
    try:
        gen.submit()
        if stream:
            return await _stream(request, gen, shape, head, include_usage)
        return await _whole(gen, shape, head)
    except asyncio.CancelledError:
        gen.cancel()  # the client hung up: stop generating for nobody
        raise
    finally:
        state.in_flight -= 1


async def _whole(gen: Generation, shape: AnswerShape, head: dict[str, object]) -> web.Response:
    try:
        async for _ in gen.events():
            pass
    except GenerationFailed as exc:
        gen.cancel()  # the other choices would run for nobody
        raise ApiError(str(exc), 500) from None
    choices = [
        shape.whole(c, new_logprobs(c, (c.usage or {}).get("completion_tokens")))
        for c in gen.choices
    ]
    body = {
        **head,
        "object": shape.object,
        "choices": choices,
        "usage": gen.usage(),
        "kcops": gen.kcops_info(),
    }
    return web.json_response(body)


async def _stream(
    request: web.Request,
    gen: Generation,
    shape: AnswerShape,
    head: dict[str, object],
    include_usage: bool,
) -> web.StreamResponse:
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    extra = {"usage": None} if include_usage else {}

    async def send(payload: dict[str, object]) -> None:
        await resp.write(f"data: {json.dumps(payload)}\n\n".encode())

    async def chunk(choice: dict[str, object] | None) -> None:
        if choice is not None:
            await send({**head, "object": shape.chunk_object, "choices": [choice], **extra})

    try:
        for c in gen.choices:
            await chunk(shape.opening(c))
        try:
            async for c, ev in gen.events():
                if ev.kind == "delta":
                    await chunk(shape.delta(c, ev.text, new_logprobs(c, ev.tokens)))
                else:
                    upto = (c.usage or {}).get("completion_tokens")
                    await chunk(shape.closing(c, new_logprobs(c, upto)))
        except GenerationFailed as exc:
            gen.cancel()
            await send(ApiError(str(exc), 500).body())
        else:
            if include_usage:
                usage = {**head, "object": shape.chunk_object, "choices": [], "usage": gen.usage()}
                await send(usage)
        await resp.write(b"data: [DONE]\n\n")
    except ConnectionResetError:
        gen.cancel()
        raise
    return resp
