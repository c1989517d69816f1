"""Request bodies of the worker's HTTP API as pydantic models (the input edge).

Like vLLM's ``protocol.py``: one model per request with field constraints, strict
types (a boolean is a boolean, an integer is not a string), and unknown fields of
the OpenAI requests accepted and ignored (logged), as vLLM and the OpenAI SDK's
``extra_body`` expect. Admin bodies are ours: unknown fields there are refused.

Bodies are parsed from raw bytes with ``model_validate_json``: invalid UTF-8,
lone surrogates, nesting deeper than the parser allows and malformed JSON are all
one :class:`ApiError` (400), never a 500. Error messages name the field and what
is allowed, never echo the whole value.
"""

from __future__ import annotations

import logging
from typing import Annotated, ClassVar, Literal, TypeVar

import pydantic_core
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

log = logging.getLogger("kcops.worker")

MAX_PROMPTS = 64  # prompts in one completions request
MAX_CHOICES = 64  # prompts x n
MAX_TOKENS_CAP = 1_000_000  # a bound for the parser; the context length is checked later
MAX_STOPS = 4  # as OpenAI
MAX_TOP_LOGPROBS = 5  # as OpenAI's completions API
MAX_MESSAGES = 512
MAX_TEXT_CHARS = 4 * 1024**2
UNION_HINTS = {
    "prompt": (
        "must be a non-empty string, a list of strings, a list of token ids "
        f"(integers >= 0) or a list of such lists (at most {MAX_PROMPTS} prompts)"
    ),
    "stop": f"must be a non-empty string or a list of at most {MAX_STOPS} such strings",
}


class ApiError(Exception):
    """An error answered in the OpenAI shape ``{"error": {message, type, param, code}}``.

    The status decides the OpenAI SDK's exception class (400 BadRequestError,
    401 AuthenticationError, 404 NotFoundError, 503/500 InternalServerError)."""

    TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        401: "authentication_error",
        404: "invalid_request_error",
        405: "invalid_request_error",
        413: "invalid_request_error",
        503: "service_unavailable_error",
    }

    def __init__(
        self, message: str, status: int = 400, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code

    def body(self) -> dict[str, object]:
        kind = self.TYPES.get(self.status, "server_error")
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS)]
TokenId = Annotated[StrictInt, Field(ge=0)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0, allow_inf_nan=False, strict=True)]
TopP = Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False, strict=True)]
MaxTokens = Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS_CAP)]
Seed = Annotated[StrictInt, Field(ge=0, lt=2**63)]
N = Annotated[StrictInt, Field(ge=1, le=MAX_CHOICES)]
Stop = Annotated[str, Field(min_length=1, max_length=1024, strict=True)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    include_usage: StrictBool = False


class _OpenAIBody(BaseModel):
    # vLLM's OpenAIBaseModel: extra fields are kept, ignored and logged.
    model_config = ConfigDict(extra="allow", strict=True)

    model: Annotated[str, Field(max_length=256)] | None = None
    n: N = 1
    seed: Seed | None = None
    temperature: Temperature = 1.0
    top_p: TopP = 1.0
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # OpenAI's end-user id: a tenant label source (kcops.tenant), never exported raw.
    user: str | None = None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        # As OpenAI and vLLM: options of a stream that is not asked for are a mistake.
        if value is not None and not info.data.get("stream", False):
            raise pydantic_core.PydanticCustomError(
                "stream_options_without_stream", "allowed only with 'stream': true"
            )
        return value

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_OpenAIBody):
    """``POST /v1/completions``: a string, a list of strings, token ids, or lists of them."""

    prompt: (
        Text
        | Annotated[list[Text], Field(min_length=1, max_length=MAX_PROMPTS)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]
    )
    max_tokens: MaxTokens = 16
    echo: StrictBool = False
    logprobs: Annotated[StrictInt, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    type: Literal["text"]
    text: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: (
        Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
        | Annotated[list[TextPart], Field(max_length=256)]
        | None
    ) = None
    name: Annotated[str, Field(max_length=256)] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_OpenAIBody):
    """``POST /v1/chat/completions``: messages rendered with the model's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_tokens: MaxTokens | None = None
    max_completion_tokens: MaxTokens | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None

    def token_budget(self) -> int | None:
        """The completion budget asked for; None: the rest of the context (as vLLM)."""
        return self.max_completion_tokens if self.max_completion_tokens else self.max_tokens


class EvictBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    policy: Literal["lru", "expired", "all"] = "lru"
    fraction: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 1.0


class RouteBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    mode: str


class AttentionBody(BaseModel):
    # Values are checked by Control.set_budget (bounds depend on the live config).
    model_config = ConfigDict(extra="forbid")
    top_n: object = None
    top_n_by_layer: object = None
    dense_layers: object = None


class DrainBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    admit: StrictBool


M = TypeVar("M", bound=BaseModel)
MAX_WARNED = 64
_warned: set[tuple[str, ...]] = set()  # field sets already logged (process-wide, capped)


def parse(model: type[M], raw: bytes) -> M:
    """Validate a raw JSON body; any problem is an :class:`ApiError` (400)."""
    try:
        body = model.model_validate_json(raw or b"null")
    except ValidationError as exc:
        message, param = _describe(exc)
        raise ApiError(message, param=param) from None
    except (ValueError, RecursionError):
        raise ApiError("request body is not valid JSON") from None
    extra = tuple(sorted(body.model_extra or {}))[:10]
    if extra and extra not in _warned and len(_warned) < MAX_WARNED:
        # As vLLM: say once which fields were ignored (a bounded set: no log flood).
        _warned.add(extra)
        log.warning("ignored request fields: %s", ", ".join(f[:40] for f in extra))
    return body


def _describe(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors(include_input=False, include_url=False)
    if any(e["type"] == "json_invalid" for e in errors):
        return "request body is not valid JSON (UTF-8, no lone surrogates, not too deep)", None
    if any(e["type"] == "model_type" and not e["loc"] for e in errors):
        return "request body must be a JSON object", None
    # A union reports one error per branch: say what the field allows instead.
    errors.sort(key=lambda e: len(e["loc"]))
    param = ".".join(str(p) for p in errors[0]["loc"] if not _is_branch(p)) or None
    top = {e["loc"][0] for e in errors if e["loc"]}
    if len(errors) > 1 and len(top) == 1 and str(errors[0]["loc"][0]) in UNION_HINTS:
        field = str(errors[0]["loc"][0])
        return f"'{field}' {UNION_HINTS[field]}", field
    parts = []
    for e in errors[:3]:
        loc = ".".join(str(p) for p in e["loc"] if not _is_branch(p)) or "body"
        parts.append(f"'{loc}': {e['msg']}")
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return "; ".join(parts) + more, param


def _is_branch(part: object) -> bool:
    # Union branches appear in a loc as type names such as 'str' or 'list[int]'.
    return isinstance(part, str) and (
        part in ("str", "int", "float", "bool") or "[" in part or part.startswith("constrained-")
    )


def parse_json(raw: bytes) -> object:
    """Any JSON value, with the same refusals as :func:`parse` (UTF-8, surrogates, depth, NaN)."""
    try:
        return pydantic_core.from_json(raw or b"null", allow_inf_nan=False)
    except ValueError:
        raise ApiError("request body is not valid JSON") from None
