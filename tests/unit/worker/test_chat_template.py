"""The chat template: the model's own, and the ChatML fallback for a tokenizer without one."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kcops.worker.models import load_tokenizer
from kcops.worker.openai_api import render_chat
from kcops.worker.protocol import ApiError, ChatMessage


@pytest.fixture(scope="module")
def tok() -> Any:
    return load_tokenizer(progress=False)


MESSAGES = [
    ChatMessage(role="developer", content="Be brief."),
    ChatMessage(role="user", content="Say hello."),
]


def test_a_tokenizer_without_a_template_gets_chatml(tok: Any) -> None:
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    text = bare.decode(render_chat(bare, MESSAGES))
    # "developer" is sent as "system", and the assistant's turn is opened for the model.
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nSay hello.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_models_own_template_is_used_when_it_has_one(tok: Any) -> None:
    assert tok.chat_template  # SmolLM2 ships one
    own = tok.decode(render_chat(tok, MESSAGES[1:]))
    want = tok.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], tokenize=False, add_generation_prompt=True
    )
    assert own == want


def test_a_template_that_refuses_is_a_400(tok: Any) -> None:
    strict = copy.deepcopy(tok)
    strict.chat_template = "{{ raise_exception('only one turn') }}"
    with pytest.raises(ApiError) as err:
        render_chat(strict, MESSAGES)
    assert err.value.status == 400 and err.value.param == "messages"
    assert "only one turn" in err.value.message
