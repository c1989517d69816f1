"""The prompts the Locust users send, apart from Locust itself.

Importing ``locust`` monkey-patches the whole process with gevent, which a test
runner's threads do not survive (pytest-xdist's workers crashed on it): what
decides the traffic's shape lives here, and ``locustfile`` only sends it.
"""

from __future__ import annotations

import os
import random

SHORT_CHARS = (120, 400)  # well under the worker's --long-threshold tokens
LONG_CHARS = (1800, 3600)
POOL = 24


def _corpus() -> list[str]:
    import pydoc_data.topics as topics

    texts = sorted((t for t in topics.topics.values() if len(t) > LONG_CHARS[1]), key=len)
    return texts[:POOL]


CORPUS = _corpus()
MODE_FILE = os.environ.get("KCOPS_LOAD_MODE_FILE", "")


def load_mode() -> str:
    if not MODE_FILE:
        return "mixed"
    try:
        with open(MODE_FILE) as fh:
            return fh.read().strip() or "mixed"
    except OSError:
        return "mixed"


# Chat traffic shares an instruction prefix across requests; a prefix cache
# exists for it. Short enough that short prompts stay under the long threshold.
SYSTEM = "You answer questions about Python from its reference manual. Be brief.\n\n"


def prompt(kind: str, rng: random.Random, mode: str = "mixed") -> str:
    if mode == "hot":
        # Everyone asks about the same long document: its cached KV is read back
        # on every request (from the Redis tier when the memory tier is smaller).
        return SYSTEM + CORPUS[0][: LONG_CHARS[1]]
    if mode in ("long", "short"):
        kind = mode
    lo, hi = SHORT_CHARS if kind == "short" else LONG_CHARS
    text = SYSTEM + rng.choice(CORPUS)[: rng.randint(lo, hi)]
    if mode == "unique":
        # A different first block for every request: the prefix cache cannot hit.
        text = f"Request {rng.getrandbits(64):016x}. " + text
    return text
