"""The worker's request models: strict types, bounds, short messages, the OpenAI error shape."""

from __future__ import annotations

import pytest

from kcops.worker.protocol import (
    MAX_CHOICES,
    ApiError,
    ChatCompletionRequest,
    CompletionRequest,
    DrainBody,
    EvictBody,
    parse,
    parse_json,
)


def test_prompt_forms_the_api_allows() -> None:
    for prompt in ('"hi"', '["a", "b"]', "[1, 2]", "[[1, 2], [3]]"):
        body = parse(CompletionRequest, f'{{"prompt": {prompt}}}'.encode())
        assert body.prompt and body.max_tokens == 16 and body.n == 1


@pytest.mark.parametrize(
    "raw,param",
    [
        (b'{"prompt": "hi", "stream": "false"}', "stream"),
        (b'{"prompt": "hi", "max_tokens": true}', "max_tokens"),
        (b'{"prompt": "hi", "max_tokens": "5"}', "max_tokens"),
        (b'{"prompt": "hi", "temperature": 2.5}', "temperature"),
        (b'{"prompt": "hi", "top_p": 0}', "top_p"),
        (b'{"prompt": "hi", "n": ' + str(MAX_CHOICES + 1).encode() + b"}", "n"),
        (b'{"prompt": "hi", "seed": 9223372036854775808}', "seed"),
        (b'{"prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}', "stop"),
        (b'{"prompt": "hi", "logprobs": 6}', "logprobs"),
        (b'{"prompt": "hi", "stream_options": {"include_usage": true}}', "stream_options"),
        (b'{"prompt": "hi", "stream": false, "stream_options": {}}', "stream_options"),
        (b'{"prompt": [1, -1]}', "prompt"),
        (b'{"prompt": [true]}', "prompt"),
        (b'{"prompt": ""}', "prompt"),
        (b'{"prompt": []}', "prompt"),
        (b"{}", "prompt"),
    ],
)
def test_bad_fields_name_the_field(raw: bytes, param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse(CompletionRequest, raw)
    assert err.value.status == 400 and err.value.param == param
    assert err.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": "a\\ud800"}',
        b"[" * 100_000,
        b'{"prompt": "\xff"}',
        b'{"prompt": "hi", "max_tokens": 1' + b"0" * 10_000 + b"}",
        b'{"prompt": "hi", "temperature": NaN}',
        b"",
        b"[1, 2]",
    ],
)
def test_hostile_json_is_a_400_with_a_short_message(raw: bytes) -> None:
    with pytest.raises(ApiError) as err:
        parse(CompletionRequest, raw)
    assert err.value.status == 400 and len(err.value.message) < 300
    with pytest.raises(ApiError):
        parse_json(raw) if raw not in (b"", b"[1, 2]") else parse(DrainBody, raw)


def test_unknown_openai_fields_are_ignored_admin_fields_refused() -> None:
    raw = b'{"prompt": "hi", "user": "me", "presence_penalty": 0, "logit_bias": {}}'
    body = parse(CompletionRequest, raw)
    assert body.model_extra == {"presence_penalty": 0, "logit_bias": {}}
    assert body.user == "me"  # OpenAI's end-user id: a tenant source (kcops.tenant)
    with pytest.raises(ApiError):
        parse(EvictBody, b'{"policy": "lru", "fractoin": 0.5}')


def test_chat_budget_and_message_content_parts() -> None:
    raw = (
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},'
        b' {"type": "text", "text": "b"}]}], "max_tokens": 4, "max_completion_tokens": 7}'
    )
    body = parse(ChatCompletionRequest, raw)
    assert body.messages[0].text() == "ab" and body.token_budget() == 7
    assert parse(ChatCompletionRequest, b'{"messages": [{"role": "user"}]}').token_budget() is None
    with pytest.raises(ApiError) as err:
        parse(ChatCompletionRequest, b'{"messages": [{"role": "wizard", "content": "x"}]}')
    assert err.value.param == "messages.0.role"


def test_the_error_shape() -> None:
    err = ApiError("no such model", 404, param="model", code="model_not_found").body()
    assert err == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
