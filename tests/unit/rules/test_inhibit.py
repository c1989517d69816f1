"""Inhibition as Alertmanager defines it, applied by the agent: matchers, the rule, and the
packaged table, where the agent's own restart inhibits the KcopsEngineDown it causes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kcops.agent import rules
from kcops.agent.events import AlertTransition
from kcops.agent.rules.inhibit import Inhibitor, InhibitRule, Matcher
from kcops.agent.samples import SeriesKey, label_pairs
from tests.unit.rules.test_component import T0, feed_healthy, make_ctx


@pytest.mark.parametrize(
    ("text", "labels", "want"),
    [
        ('alertname="A"', {"alertname": "A"}, True),
        ('alertname="A"', {"alertname": "AB"}, False),
        ('alertname!="A"', {"alertname": "B"}, True),
        ('alertname=~"A|B"', {"alertname": "B"}, True),
        ('alertname=~"A|B"', {"alertname": "AB"}, False),  # anchored, as Alertmanager's
        ('pod!~"x-.*"', {"pod": "x-1"}, False),
        ('pod=""', {}, True),  # an absent label is the empty string
        ('msg="say \\"hi\\""', {"msg": 'say "hi"'}, True),
    ],
)
def test_matchers_mean_what_alertmanagers_mean(
    text: str, labels: dict[str, str], want: bool
) -> None:
    assert Matcher.parse(text).matches(labels) is want


@pytest.mark.parametrize("bad", ["alertname=A", '1x="a"', 'a=="b"', 'a=~"("'])
def test_a_bad_matcher_is_refused_naming_the_syntax(bad: str) -> None:
    with pytest.raises(ValueError):
        Matcher.parse(bad)


def _tr(name: str, state: str, t: float, **labels: str) -> AlertTransition:
    prev = "pending" if state == "firing" else "firing"
    return AlertTransition(name, {"alertname": name, **labels}, prev, state, t)  # type: ignore[arg-type]


def test_a_target_firing_under_a_source_is_held_then_released_once_the_source_ends() -> None:
    rule = InhibitRule(
        (Matcher.parse('alertname="Restarting"'),),
        (Matcher.parse('alertname="Down"'),),
        ("engine",),
    )
    inh = Inhibitor([rule])
    source = [("Restarting", label_pairs({"alertname": "Restarting", "engine": "e1"}))]
    out = inh.apply([_tr("Down", "firing", 10, engine="e1")], source, 10)
    assert [(t.alertname, t.inhibited_by) for t in out] == [("Down", "Restarting")]
    assert inh.inhibited_by("Down", {"alertname": "Down", "engine": "e1"}) == "Restarting"
    # another engine's Down: the `equal` label differs, not inhibited
    out = inh.apply([_tr("Down", "firing", 11, engine="e2")], source, 11)
    assert [t.inhibited_by for t in out] == [None]
    # the source ends, the target still fires: published again, as an incident of its own
    out = inh.apply([], [], 20)
    assert [(t.alertname, t.previous, t.state, t.t, t.inhibited_by) for t in out] == [
        ("Down", "firing", "firing", 20, None)
    ]
    assert inh.inhibited_by("Down", {"alertname": "Down", "engine": "e1"}) is None


def test_a_held_target_that_resolves_is_published_resolved_and_forgotten() -> None:
    rule = InhibitRule((Matcher.parse('alertname="S"'),), (Matcher.parse('alertname="T"'),))
    inh = Inhibitor([rule])
    src = [("S", label_pairs({"alertname": "S"}))]
    inh.apply([_tr("T", "firing", 1)], src, 1)
    out = inh.apply([_tr("T", "inactive", 2)], src, 2)
    assert [(t.state, t.inhibited_by) for t in out] == [("inactive", None)]
    assert inh.apply([], [], 3) == []  # nothing left to release


def test_an_alert_never_inhibits_itself() -> None:
    rule = InhibitRule((Matcher.parse('alertname=~".+"'),), (Matcher.parse('alertname=~".+"'),))
    inh = Inhibitor([rule])
    me = [("A", label_pairs({"alertname": "A"}))]
    assert [t.inhibited_by for t in inh.apply([_tr("A", "firing", 1)], me, 1)] == [None]


def test_the_agents_own_restart_inhibits_the_engine_down_it_causes(tmp_path: Path) -> None:
    """The packaged table: kcops_engine_restarting at 1 (the agent's restart, from the
    kill until the new engine is ready) makes the KcopsEngineDown of the kill window an
    inhibited one; a Down with no restart behind it is not."""
    ctx = make_ctx(tmp_path)
    (comp,) = rules.build(ctx)
    seen: list[AlertTransition] = []
    ctx.bus.subscribe(seen.append)
    restarting = SeriesKey.of("kcops_engine_restarting", {"engine": "e1"})

    async def run() -> None:
        await comp.start()
        for i in range(90):
            t = T0 + i
            feed_healthy(ctx.store, t, 0.0 if 10 <= i < 30 or 60 <= i < 80 else 1.0)
            ctx.store.append(restarting, t, 1.0 if 8 <= i < 32 else 0.0)
            await comp.tick(t)
            if i == 20:
                (down,) = [a for a in comp.active() if a["alertname"] == "KcopsEngineDown"]
                assert down["state"] == "firing"
                assert down["inhibited_by"] == "KcopsEngineRestarting"
        await comp.stop()

    asyncio.run(run())
    downs = [(tr.t - T0, tr.state, tr.inhibited_by) for tr in seen
             if tr.alertname == "KcopsEngineDown"]  # fmt: skip
    assert downs == [
        (10, "pending", None),
        (15, "firing", "KcopsEngineRestarting"),  # the restart's own: inhibited
        (30, "inactive", None),
        (60, "pending", None),
        (65, "firing", None),  # no restart behind it: an incident, paged
        (80, "inactive", None),
    ]
