"""The bounds of one template expansion: output size, and the text its functions make.

See templates.py: an expansion's output is at most :data:`MAX_OUTPUT_BYTES`
of UTF-8, cut past it with :data:`TRUNCATED` at its end, and its functions
may produce at most :data:`MAX_WORK_CHARS` of text together.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_OUTPUT_BYTES = 64 * 1024
MAX_WORK_CHARS = 16 * MAX_OUTPUT_BYTES
TRUNCATED = f"...[truncated: template output over {MAX_OUTPUT_BYTES} bytes]"


class TemplateRuntimeError(Exception):
    pass


@dataclass
class TemplateStats:
    """Expansions cut at :data:`MAX_OUTPUT_BYTES`, and failed past :data:`MAX_WORK_CHARS`."""

    truncated: int = 0
    over_work: int = 0


class Work:
    """The text the functions of one expansion have produced, against MAX_WORK_CHARS."""

    __slots__ = ("used",)

    def __init__(self) -> None:
        self.used = 0

    def left(self) -> int:
        return MAX_WORK_CHARS - self.used

    def charge(self, text: str) -> str:
        self.used += len(text)
        if self.used > MAX_WORK_CHARS:
            raise OverWork(
                f"its functions produced more than {MAX_WORK_CHARS} characters "
                f"(the output bound is {MAX_OUTPUT_BYTES} bytes)"
            )
        return text


class OverWork(TemplateRuntimeError):
    pass


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def bound_output(text: str, stats: TemplateStats | None = None) -> str:
    """``text``, or its longest prefix that fits :data:`MAX_OUTPUT_BYTES` with
    :data:`TRUNCATED` after it."""
    if len(text) <= MAX_OUTPUT_BYTES // 4 or _utf8_len(text) <= MAX_OUTPUT_BYTES:
        return text
    if stats is not None:
        stats.truncated += 1
    limit = MAX_OUTPUT_BYTES - len(TRUNCATED)
    text = text[:limit]
    excess = _utf8_len(text) - limit
    while excess > 0:  # a character is at most 4 bytes: drop at least a quarter of the excess
        text = text[: len(text) - max(1, excess // 4)]
        excess = _utf8_len(text) - limit
    return text + TRUNCATED
