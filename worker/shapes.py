"""Response shapes of the two OpenAI endpoints: completions and chat completions.

A shape turns a choice's text and logprobs into the JSON the OpenAI SDK parses:
whole responses, and stream chunks (an opening chunk, deltas, a closing chunk).
Logprobs come from the served logits (see ``engine.served_logprobs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kcops.worker.generation import Choice, TokenLogprob

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# One JSON object of an answer or a stream chunk: built here, serialised by the caller.
JsonDict = dict[str, object]


class AnswerShape:
    """What both endpoints share; subclasses fill the per-choice dicts."""

    object = ""
    chunk_object = ""
    id_prefix = ""

    def __init__(self, tok: PreTrainedTokenizerBase, logprobs: bool) -> None:
        self.tok, self.logprobs = tok, logprobs

    def token_text(self, token_id: int) -> str:
        return str(self.tok.decode([token_id]))

    def opening(self, choice: Choice) -> JsonDict | None:
        return None

    def delta(self, choice: Choice, text: str, lps: list[TokenLogprob]) -> JsonDict:
        raise NotImplementedError

    def closing(self, choice: Choice, lps: list[TokenLogprob]) -> JsonDict:
        raise NotImplementedError

    def whole(self, choice: Choice, lps: list[TokenLogprob]) -> JsonDict:
        raise NotImplementedError


class CompletionShape(AnswerShape):
    object = chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, tok: PreTrainedTokenizerBase, logprobs: bool, echo: dict[int, str]) -> None:
        super().__init__(tok, logprobs)
        self.echo = echo  # choice index -> prompt text to prepend
        self._offset: dict[int, int] = {}  # text_offset of the next token, per choice

    def _logprobs(self, choice: Choice, lps: list[TokenLogprob]) -> JsonDict | None:
        if not self.logprobs:
            return None
        tokens, offsets = [], []
        at = self._offset.get(choice.index, len(self.echo.get(choice.index, "")))
        for token_id, _, _ in lps:
            tokens.append(self.token_text(token_id))
            offsets.append(at)
            at += len(tokens[-1])
        self._offset[choice.index] = at
        return {
            "tokens": tokens,
            "token_logprobs": [lp for _, lp, _ in lps],
            "top_logprobs": [{self.token_text(t): v for t, v in top} for _, _, top in lps],
            "text_offset": offsets,
        }

    def _choice(
        self, choice: Choice, text: str, lps: list[TokenLogprob], finish: str | None
    ) -> JsonDict:
        return {
            "index": choice.index,
            "text": text,
            "logprobs": self._logprobs(choice, lps),
            "finish_reason": finish,
        }

    def opening(self, choice: Choice) -> JsonDict | None:
        echo = self.echo.get(choice.index)
        return self._choice(choice, echo, [], None) if echo else None

    def delta(self, choice: Choice, text: str, lps: list[TokenLogprob]) -> JsonDict:
        return self._choice(choice, text, lps, None)

    def closing(self, choice: Choice, lps: list[TokenLogprob]) -> JsonDict:
        return self._choice(choice, "", lps, choice.finish_reason)

    def whole(self, choice: Choice, lps: list[TokenLogprob]) -> JsonDict:
        text = self.echo.get(choice.index, "") + "".join(choice.text)
        return self._choice(choice, text, lps, choice.finish_reason)


class ChatShape(AnswerShape):
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def _entry(self, token_id: int, logprob: float) -> JsonDict:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8", "replace"))}

    def _logprobs(self, lps: list[TokenLogprob]) -> JsonDict | None:
        if not self.logprobs:
            return None
        content = []
        for token_id, logprob, top in lps:
            entry = self._entry(token_id, logprob)
            entry["top_logprobs"] = [self._entry(t, v) for t, v in top]
            content.append(entry)
        return {"content": content}

    def _chunk(
        self, choice: Choice, delta: JsonDict, lps: list[TokenLogprob], finish: str | None
    ) -> JsonDict:
        logprobs = self._logprobs(lps) if lps else None
        return {
            "index": choice.index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish,
        }

    def opening(self, choice: Choice) -> JsonDict | None:
        return self._chunk(choice, {"role": "assistant", "content": ""}, [], None)

    def delta(self, choice: Choice, text: str, lps: list[TokenLogprob]) -> JsonDict:
        return self._chunk(choice, {"content": text}, lps, None)

    def closing(self, choice: Choice, lps: list[TokenLogprob]) -> JsonDict:
        return self._chunk(choice, {}, lps, choice.finish_reason)

    def whole(self, choice: Choice, lps: list[TokenLogprob]) -> JsonDict:
        return {
            "index": choice.index,
            "message": {"role": "assistant", "content": "".join(choice.text)},
            "logprobs": self._logprobs(lps),
            "finish_reason": choice.finish_reason,
        }
