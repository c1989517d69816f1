"""The prompts the Locust users send, apart from Locust itself.

Importing ``locust`` monkey-patches the whole process with gevent, which a test
runner's threads do not survive (pytest-xdist's workers crashed on it): what
decides the traffic's shape lives here, and ``locustfile`` only sends it.

Environment: ``KCOPS_LOAD_POOL`` (24) documents to draw from, fewer for more
prefix reuse; ``KCOPS_LOAD_LONG_CHARS`` (``1800-3600``) the range of a long
prompt's length in characters.
"""

from __future__ import annotations

import os
import random

SHORT_CHARS = (120, 400)  # well under the worker's --long-threshold tokens
HOT_CHARS = 3600  # the hot document: its KV is larger than the demo's memory tier
LONGER_CHARS = (6000, 8000)  # mode "long": cut from the longest documents
# mixed: two short prompts for each long one; unique: no prefix reuse; unique-long:
# long prompts with no reuse (every prompt's KV is new); long: only prompts of
# LONGER_CHARS from the longest documents, past any the mix sends (K(C) rises);
# short: short prompts only; hot: one long document for everyone.
MODES = ("mixed", "unique", "unique-long", "long", "short", "hot")


def _env_int(name: str, default: int, lo: int, hi: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise ValueError(f"{name}={raw!r}: expected an integer in [{lo}, {hi}]")
    return value


def _long_chars() -> tuple[int, int]:
    raw = os.environ.get("KCOPS_LOAD_LONG_CHARS", "").strip() or "1800-3600"
    lo_s, _, hi_s = raw.partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s)
    except ValueError:
        lo = hi = -1
    if not 0 < lo <= hi <= HOT_CHARS:
        raise ValueError(
            f"KCOPS_LOAD_LONG_CHARS={raw!r}: expected LO-HI characters, 0 < LO <= HI <= {HOT_CHARS}"
        )
    return lo, hi


LONG_CHARS = _long_chars()
POOL = _env_int("KCOPS_LOAD_POOL", 24, 1, 24)


def _docs(longer_than: int) -> list[str]:
    """CPython's reference topics longer than ``longer_than`` characters, shortest first."""
    import pydoc_data.topics as topics

    return sorted((t for t in topics.topics.values() if len(t) > longer_than), key=len)


CORPUS = _docs(HOT_CHARS)[:POOL]
LONGEST = _docs(LONGER_CHARS[1])[-4:]
MODE_FILE = os.environ.get("KCOPS_LOAD_MODE_FILE", "")


def load_mode() -> str:
    if not MODE_FILE:
        return "mixed"
    try:
        with open(MODE_FILE) as fh:
            mode = fh.read().strip() or "mixed"
    except OSError:
        return "mixed"
    return mode if mode in MODES else "mixed"


# Chat traffic shares an instruction prefix across requests; a prefix cache
# exists for it. Short enough that short prompts stay under the long threshold.
SYSTEM = "You answer questions about Python from its reference manual. Be brief.\n\n"


def prompt(kind: str, rng: random.Random, mode: str = "mixed") -> str:
    """A prompt of ``kind`` (short or long) shaped by the traffic ``mode`` (see MODES)."""
    if mode == "hot":
        # Everyone asks about the same long document: its cached KV is read back
        # on every request (from the Redis tier when the memory tier is smaller).
        return SYSTEM + CORPUS[0][:HOT_CHARS]
    if mode == "long":  # the traffic shifts to far longer prompts than the mix's
        return SYSTEM + rng.choice(LONGEST)[: rng.randint(*LONGER_CHARS)]
    if mode == "short":
        kind = mode
    elif mode == "unique-long":
        kind = "long"
    lo, hi = SHORT_CHARS if kind == "short" else LONG_CHARS
    text = SYSTEM + rng.choice(CORPUS)[: rng.randint(lo, hi)]
    if mode in ("unique", "unique-long"):
        # A different first block for every request: the prefix cache cannot hit,
        # and every prompt's KV is new to the cache.
        text = f"Request {rng.getrandbits(64):016x}. " + text
    return text
