"""The Locust users' traffic modes that the demo's drills switch between."""

from __future__ import annotations

import random

from kcops.demo.load import prompts as lf


def test_modes_shape_the_prompts() -> None:
    rng = random.Random(7)
    hot = {lf.prompt(kind, rng, "hot") for kind in ("short", "long") * 5}
    assert len(hot) == 1 and len(hot.pop()) > lf.LONG_CHARS[0]
    assert all(len(lf.prompt("long", rng, "short")) < lf.SHORT_CHARS[1] + 200 for _ in range(20))
    assert all(len(lf.prompt("short", rng, "long")) > lf.LONGER_CHARS[0] for _ in range(20))
    assert lf.LONGER_CHARS[0] > lf.LONG_CHARS[1]  # longer than any prompt of the mix
    fresh = [lf.prompt("short", rng, "unique-long") for _ in range(20)]
    assert len({p[:40] for p in fresh}) == 20 and all(len(p) > lf.LONG_CHARS[0] for p in fresh)
    firsts = {lf.prompt("short", rng, "unique")[:40] for _ in range(20)}
    assert len(firsts) == 20  # no two prompts share a first block
