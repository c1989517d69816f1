"""A healthy vLLM under light load for five minutes from a cold start, supervised by an
agent with the default configuration in enforce mode: no page fires, no action runs."""

from __future__ import annotations

import pytest

from tests.engines.vllm.conftest import Soak

pytestmark = pytest.mark.vllm

TAKEN = ("ok", "failed", "timeout")


def test_healthy_vllm_is_left_alone(soak: Soak) -> None:
    v = soak.finish()
    assert v["polls"] > 100, f"the agent's alerts were read only {v['polls']} times"
    assert v["load_ok"] > 20 and not v["load_errors"], (v["load_ok"], v["load_errors"][:3])
    assert not v["pages"], f"page alerts fired: {v['pages']}"
    assert not v["page_records"], v["page_records"]
    # A refused step (a ticket's notify with no URL configured) is audited but not taken
    # (DESIGN §6): only runs that acted, or tried to, count.
    taken = [a for a in v["actions"] if a["outcome"] in TAKEN]
    assert not taken, f"actions taken: {[(a['action'], a['outcome']) for a in taken]}"
