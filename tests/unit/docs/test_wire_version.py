"""docs/probe.md names the wire version the code speaks (``wire.VERSION``)."""

from __future__ import annotations

import re
from pathlib import Path

from kcops.kernels import wire

PROBE_MD = Path(__file__).resolve().parents[3] / "docs" / "probe.md"


def test_probe_doc_gives_the_current_wire_version() -> None:
    text = PROBE_MD.read_text(encoding="utf-8")
    heading = re.search(r"^## Wire format \(version (\d+)\)$", text, re.MULTILINE)
    assert heading is not None and int(heading[1]) == wire.VERSION, "docs/probe.md's heading"
    # Every place that says which version is spoken now (not the history of the old ones).
    said = re.findall(r"version \((\d+)|Version (\d+) is the one|a version other than (\d+)", text)
    assert {int(n) for found in said for n in found if n} == {wire.VERSION}, said
