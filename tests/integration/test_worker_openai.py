"""The worker driven by the official ``openai`` client (sync and async) on the tiny model,
plus raw HTTP for what the SDK never sends (hostile bodies, bad credentials)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
import torch
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from kcops.worker.app import Background, WorkerOptions, build
from kcops.worker.server import WorkerState
from tests.services import free_port

MODEL = "tiny"
LONG = "The quick brown fox jumps over the lazy dog. " * 12  # ~120 tokens
CHAT: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def worker() -> Iterator[tuple[WorkerState, str]]:
    torch.set_num_threads(1)
    opts = WorkerOptions(
        model=MODEL, token="t", long_threshold=64, top_n=16, progress=False, install_probe=False
    )
    state = build(opts)
    bg = Background(state, "127.0.0.1", free_port())
    with bg:
        yield state, bg.url


@pytest.fixture(scope="module")
def client(worker: tuple[WorkerState, str]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=worker[1] + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def scrape(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            labels = {k: v for k, v in sorted(s.labels.items()) if k != "model_name"}
            out[s.name + json.dumps(labels)] = s.value
    return out


def test_chat_uses_the_models_chat_template(
    worker: tuple[WorkerState, str], client: openai.OpenAI
) -> None:
    state, _ = worker
    r = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=5, temperature=0)
    assert r.object == "chat.completion" and len(r.choices) == 1
    msg = r.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert r.choices[0].finish_reason in ("length", "stop")
    rendered = state.engine.tok.apply_chat_template(
        CHAT, tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>assistant" in rendered
    ids = state.engine.tok(rendered, add_special_tokens=False).input_ids
    assert r.usage is not None and r.usage.prompt_tokens == len(ids)
    # the same text as a plain completion of the rendered prompt: one engine, one path
    c = client.completions.create(model=MODEL, prompt=ids, max_tokens=5, temperature=0)
    assert c.choices[0].text == msg.content


def test_chat_stream_matches_non_stream_and_reports_usage(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, messages=CHAT, max_completion_tokens=6, temperature=0)
    whole = client.chat.completions.create(**kw)
    parts, finish, usage, roles = [], None, None, []
    for chunk in client.chat.completions.create(
        **kw, stream=True, stream_options={"include_usage": True}
    ):
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            assert chunk.choices == []
            usage = chunk.usage
        for ch in chunk.choices:
            roles += [ch.delta.role] if ch.delta.role else []
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    assert roles == ["assistant"]
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and whole.usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_a_list_of_prompts_gets_one_choice_each(client: openai.OpenAI) -> None:
    prompts = ["Once upon a time", "The weather today", "In a galaxy far away"]
    alone = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=4, temperature=0)
        .choices[0]
        .text
        for p in prompts
    ]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == alone
    assert r.usage is not None and r.usage.completion_tokens == 12


def test_n_choices_are_seeded_and_distinct(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(model=MODEL, prompt="Pick a word:", max_tokens=8, temperature=1.0)
    a = client.completions.create(**kw, n=2, seed=11)
    b = client.completions.create(**kw, n=2, seed=11)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert a.choices[0].text != a.choices[1].text  # seed + index: two different samples
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, n=2, max_tokens=3, temperature=1.0, seed=3
    )
    assert [c.index for c in chat.choices] == [0, 1]


def test_token_prompts_echo_and_stop(client: openai.OpenAI) -> None:
    ids = client.completions.create(model=MODEL, prompt=[[101, 102, 103], [104, 105]], max_tokens=2)
    assert len(ids.choices) == 2 and ids.usage is not None and ids.usage.prompt_tokens == 5
    plain = client.completions.create(
        model=MODEL, prompt="Hello there", max_tokens=4, temperature=0
    )
    echo = client.completions.create(
        model=MODEL, prompt="Hello there", max_tokens=4, temperature=0, echo=True
    )
    assert echo.choices[0].text == "Hello there" + plain.choices[0].text
    stop = plain.choices[0].text[2:4]
    stopped = client.completions.create(
        model=MODEL, prompt="Hello there", max_tokens=4, temperature=0, stop=stop
    )
    assert stopped.choices[0].finish_reason == "stop" and stop not in stopped.choices[0].text


def test_logprobs_come_from_the_served_logits(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="Hello there", max_tokens=4, temperature=0, logprobs=3
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert "".join(lp.tokens) == r.choices[0].text
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 3 and all(v <= 0 for v in top.values())
        assert chosen == pytest.approx(max(top.values()))  # greedy takes the top token
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    streamed = [
        tok
        for chunk in client.completions.create(
            model=MODEL, prompt="Hello there", max_tokens=4, temperature=0, logprobs=1, stream=True
        )
        for ch in chunk.choices
        if ch.logprobs is not None and ch.logprobs.tokens
        for tok in ch.logprobs.tokens
    ]
    assert streamed == lp.tokens
    chat = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2
    )
    content = chat.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == 3
    assert all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in content)


def test_long_chat_takes_the_optimized_path(worker: tuple[WorkerState, str]) -> None:
    _, url = worker
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 2}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
    assert r["kcops"]["route"] == "optimized" and r["kcops"]["top_n"] == 16
    body["messages"] = CHAT
    assert httpx.post(url + "/v1/chat/completions", json=body).json()["kcops"]["route"] == "base"


def test_chat_is_shadow_checked_as_completions(worker: tuple[WorkerState, str]) -> None:
    state, url = worker
    before = scrape(url).get("kcops_worker_shadow_checks_total{}", 0)
    state.engine.shadow_fraction = 1.0
    try:
        body = {"model": MODEL, "messages": [{"role": "user", "content": LONG}], "max_tokens": 1}
        r = httpx.post(url + "/v1/chat/completions", json={**body, "n": 2}, timeout=60)
    finally:
        state.engine.shadow_fraction = 0.0
    assert r.status_code == 200 and r.json()["kcops"]["route"] == "optimized"
    assert scrape(url)["kcops_worker_shadow_checks_total{}"] - before == 2
    assert 0.0 <= scrape(url)["kcops_worker_shadow_agreement_ratio{}"] <= 1.0


def test_chat_and_completions_count_the_same_in_metrics(
    worker: tuple[WorkerState, str], client: openai.OpenAI
) -> None:
    _, url = worker
    names = [
        "vllm:e2e_request_latency_seconds_count{}",
        "vllm:time_to_first_token_seconds_count{}",
        "vllm:inter_token_latency_seconds_count{}",
        'vllm:request_success_total{"finished_reason": "length"}',
    ]

    def moved(send: Any) -> list[float]:
        before = scrape(url)
        send()
        after = scrape(url)
        return [after.get(n, 0) - before.get(n, 0) for n in names]

    # A first token that is the end of turn would finish with "stop": ask for plain text.
    chat = moved(
        lambda: client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=5, temperature=0
        )
    )
    comp = moved(
        lambda: client.completions.create(model=MODEL, prompt="Hi", max_tokens=5, temperature=0)
    )
    assert chat == comp == [1, 1, 4, 1]


def test_bad_requests_raise_the_sdks_exceptions(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="gpt-nope", messages=CHAT)
    assert nf.value.code == "model_not_found" and nf.value.status_code == 404
    with pytest.raises(openai.BadRequestError) as br:
        client.completions.create(model=MODEL, prompt="hi", temperature=5)
    assert br.value.param == "temperature" and br.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt="word " * 2100, max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", extra_body={"n": "2"})
    assert client.models.list().data[0].id == MODEL


def test_async_client_streams_chat(worker: tuple[WorkerState, str], client: openai.OpenAI) -> None:
    _, url = worker
    want = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, temperature=0)

    async def run() -> list[str]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as ac:

            async def one() -> str:
                stream = await ac.chat.completions.create(
                    model=MODEL, messages=CHAT, max_tokens=4, temperature=0, stream=True
                )
                return "".join([ch.delta.content or "" async for c in stream for ch in c.choices])

            return list(await asyncio.gather(one(), one(), one()))

    assert asyncio.run(run()) == [want.choices[0].message.content] * 3


def test_async_client_completions_and_errors(
    worker: tuple[WorkerState, str], client: openai.OpenAI
) -> None:
    _, url = worker
    want = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0)

    async def run() -> tuple[str, str, list[int]]:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as ac:
            whole = await ac.completions.create(
                model=MODEL, prompt="The sky is", max_tokens=4, temperature=0
            )
            stream = await ac.completions.create(
                model=MODEL, prompt="The sky is", max_tokens=4, temperature=0, stream=True
            )
            streamed = "".join([ch.text async for c in stream for ch in c.choices])
            many = await ac.completions.create(
                model=MODEL, prompt=["a", "b", "c"], max_tokens=2, temperature=0
            )
            with pytest.raises(openai.NotFoundError):
                await ac.completions.create(model="gpt-nope", prompt="hi", max_tokens=2)
            with pytest.raises(openai.BadRequestError) as br:
                await ac.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2, top_p=0)
            assert br.value.param == "top_p"
            return whole.choices[0].text, streamed, sorted(c.index for c in many.choices)

    whole, streamed, indices = asyncio.run(run())
    assert whole == streamed == want.choices[0].text
    assert indices == [0, 1, 2]


def test_stream_options_without_a_stream_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as br:
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, stream_options={"include_usage": True}
        )
    assert br.value.param == "stream_options"


HOSTILE = [
    b'"a\\ud800b"',  # lone surrogate
    b"[" * 5000 + b"]" * 5000,  # deep nesting
    b'"\xff\xfe"',  # not UTF-8
    b"[true, false]",  # booleans are not token ids, nor text
    b"12",
]
FIELDS = [
    b'"max_tokens": 1' + b"0" * 5000,  # huge integer
    b'"max_tokens": 10000000000000000000000',
    b'"max_tokens": true',  # a boolean is not an integer
    b'"stream": "false"',  # a string is not a boolean
    b'"n": 1.0',
    b'"temperature": Infinity',
]


def hostile_bodies() -> list[tuple[str, bytes]]:
    ok_prompt, ok_messages = b'"prompt": "hi"', b'"messages": [{"role": "user", "content": "hi"}]'
    cases = [("/v1/completions", b'{"prompt": ' + v + b"}") for v in HOSTILE]
    cases += [
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": ' + v + b"}]}")
        for v in HOSTILE
    ]
    for f in FIELDS:
        cases.append(("/v1/completions", b"{" + ok_prompt + b", " + f + b"}"))
        cases.append(("/v1/chat/completions", b"{" + ok_messages + b", " + f + b"}"))
    cases.append(("/v1/completions", b"{" + ok_prompt + b', "echo": true, "logprobs": 1}'))
    cases.append(("/v1/chat/completions", b'{"messages": "hi"}'))
    cases += [("/v1/completions", b""), ("/v1/chat/completions", b"[]")]
    return cases


@pytest.mark.parametrize("path,raw", hostile_bodies())
def test_hostile_bodies_get_a_json_400(
    worker: tuple[WorkerState, str], path: str, raw: bytes
) -> None:
    _, url = worker
    r = httpx.post(url + path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and len(err["message"]) < 600
    # the same endpoint still serves a good request
    good = (
        b'{"prompt": "hi", "max_tokens": 1}'
        if "chat" not in path
        else (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}')
    )
    ok = httpx.post(url + path, content=good, headers={"content-type": "application/json"})
    assert ok.status_code == 200, ok.text


def raw_post(url: str, path: str, headers: bytes, body: bytes) -> tuple[int, Any]:
    """One HTTP/1.1 request written byte for byte (httpx refuses non-UTF-8 header values)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + headers
            + b"Content-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_non_utf8_credentials_get_a_json_401(worker: tuple[WorkerState, str]) -> None:
    _, url = worker
    auth = b"Authorization: Bearer \xff\xfe\r\n"
    status, body = raw_post(url, "/admin/drain", auth, b'{"admit": true}')
    assert status == 401 and body["error"] == "unauthorized"
    ok = httpx.post(
        url + "/admin/drain", json={"admit": True}, headers={"Authorization": "Bearer t"}
    )
    assert ok.status_code == 200
    bad = httpx.post(
        url + "/admin/drain", json={"admit": "no"}, headers={"Authorization": "Bearer t"}
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "admit"
