"""The Locust users' traffic modes that the demo's drills switch between."""

from __future__ import annotations

import random

from kcops.cli.load import prompts as lf


def test_modes_shape_the_prompts() -> None:
    rng = random.Random(7)
    hot = {lf.prompt(kind, rng, "hot") for kind in ("short", "long") * 5}
    assert len(hot) == 1 and len(hot.pop()) > lf.LONG_CHARS[0]
    assert all(len(lf.prompt("long", rng, "short")) < lf.SHORT_CHARS[1] + 200 for _ in range(20))
    assert all(len(lf.prompt("short", rng, "long")) > lf.LONG_CHARS[0] for _ in range(20))
    firsts = {lf.prompt("short", rng, "unique")[:40] for _ in range(20)}
    assert len(firsts) == 20  # no two prompts share a first block
