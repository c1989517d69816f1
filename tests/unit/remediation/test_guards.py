from __future__ import annotations

import pytest

from kcops.agent.config.actions import GuardsSection
from kcops.agent.outcome import ActionRejected
from kcops.agent.remediation.guards import BreakerOpen, Guards

T0 = 1_700_000_000.0


def guards(**kw: object) -> Guards:
    return Guards(GuardsSection(**kw))  # type: ignore[arg-type]


def test_cooldown_per_action_and_target() -> None:
    g = guards(cooldown_s=60)
    g.check("evict_cache", "engine", T0)
    g.start("evict_cache", "engine", "r1", T0)
    g.finish("engine")
    with pytest.raises(ActionRejected) as exc:
        g.check("evict_cache", "engine", T0 + 59)
    assert exc.value.reason == "cooldown"
    g.check("lower_topn", "engine", T0 + 1)  # another action: no cooldown
    g.check("evict_cache", "other", T0 + 1)  # another target: no cooldown
    g.check("evict_cache", "engine", T0 + 60)  # cooldown over
    g.check("evict_cache", "engine", T0 + 1, force=True)  # force skips it


def test_one_in_flight_per_target_even_forced() -> None:
    g = guards(cooldown_s=0)
    g.start("evict_cache", "engine", "r1", T0)
    for force in (False, True):
        with pytest.raises(ActionRejected) as exc:
            g.check("lower_topn", "engine", T0, force=force)
        assert exc.value.reason == "busy"
    g.finish("engine")
    g.check("lower_topn", "engine", T0)


def test_budget_opens_breaker_once_and_closes_after_the_hour() -> None:
    g = guards(cooldown_s=0, budget_per_hour=3, action_budget_per_hour=10)
    for i in range(3):
        g.check("a", "engine", T0 + i)
        g.start("a", "engine", f"r{i}", T0 + i)
        g.finish("engine")
    with pytest.raises(BreakerOpen) as exc:
        g.check("b", "engine", T0 + 10)
    assert exc.value.opened == ["*"]
    with pytest.raises(BreakerOpen) as exc:
        g.check("b", "engine", T0 + 11)
    assert exc.value.opened == []  # already open: page once
    assert g.summary(T0 + 11)["breakers_open"] == ["*"]
    g.check("b", "engine", T0 + 3600.5)  # the first run left the window
    assert g.summary(T0 + 3600.5)["breakers_open"] == []


def test_per_action_budget() -> None:
    g = guards(cooldown_s=0, budget_per_hour=100, action_budget_per_hour=2)
    for i in range(2):
        g.start("a", "engine", f"r{i}", T0 + i)
        g.finish("engine")
    with pytest.raises(BreakerOpen) as exc:
        g.check("a", "engine", T0 + 5)
    assert exc.value.opened == ["a"]
    g.check("b", "engine", T0 + 5)


def test_state_round_trip() -> None:
    g = guards(cooldown_s=60)
    g.start("a", "engine", "r1", T0)
    g2 = guards(cooldown_s=60)
    g2.load(g.to_state())
    assert g2.in_flight == {}  # in-flight is not persisted
    with pytest.raises(ActionRejected):
        g2.check("a", "engine", T0 + 30)
    assert g2.used("a", T0 + 30) == 1


def test_a_ladder_is_not_held_back_by_its_own_cooldowns() -> None:
    g = guards(cooldown_s=300)
    g.start("evict_cache", "engine", "r1", T0, owner="KcopsOOM@1")
    g.finish("engine")
    g.check("evict_cache", "engine", T0 + 30, owner="KcopsOOM@1")  # next rung, same ladder
    with pytest.raises(ActionRejected):
        g.check("evict_cache", "engine", T0 + 30, owner="KcopsOOM@2")  # a new incident
    with pytest.raises(ActionRejected):
        g.check("evict_cache", "engine", T0 + 30)  # manual
