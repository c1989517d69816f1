"""The refusal codes docs/remediation.md lists are exactly the ``Refusal`` enum's."""

from __future__ import annotations

import re
from pathlib import Path

from kcops.agent.outcome import Outcome, Refusal, of_refusal

DOC = Path(__file__).resolve().parents[3] / "docs" / "remediation.md"


def documented_codes() -> list[str]:
    """The backquoted codes between "reason code" and "null when it ran" of the audit section."""
    text = " ".join(DOC.read_text().split())
    m = re.search(r"reason code, `Refusal` in `[^`]+` — (.*?); null when it ran", text)
    assert m is not None, "docs/remediation.md lost its list of refusal codes"
    return re.findall(r"`([a-z_]+)`", m.group(1))


def test_the_docs_list_every_refusal_code_and_no_other() -> None:
    codes = documented_codes()
    assert len(codes) == len(set(codes)), "a code is listed twice"
    assert set(codes) == {str(r) for r in Refusal}


def test_every_refusal_maps_to_a_refusal_outcome() -> None:
    for r in Refusal:
        assert not of_refusal(r).ran
    assert of_refusal(Refusal.COOLDOWN) is Outcome.SKIPPED_COOLDOWN
    assert of_refusal(Refusal.UNKNOWN) is Outcome.INVALID
    assert of_refusal(Refusal.AT_BOUND) is Outcome.REFUSED
