"""The demo's drill table: selection, estimates, and every alert of the rule file covered."""

from __future__ import annotations

import time
from pathlib import Path

import click
import pytest
import yaml

from kcops.alerts import packaged_file
from kcops.demo import drills as drills_mod
from kcops.demo.drills import DRILLS, Drill, DrillResult, estimate_s, select, table


def test_every_alert_of_the_table_has_a_drill() -> None:
    rules = yaml.safe_load(packaged_file("rules.yaml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert alerts <= {d.alert for d in DRILLS}


def test_select() -> None:
    assert [d.alert for d in select("default")] == ["KcopsAttentionErrors", "KcopsEngineDown"]
    assert select("none") == []
    assert len(select("all")) == len(DRILLS)
    assert [d.alert for d in select("KcopsEngineDown")] == ["KcopsEngineDown"]
    with pytest.raises(click.BadParameter, match="KcopsNope"):
        select("KcopsNope")


def test_default_drills_fit_the_three_minute_demo() -> None:
    assert estimate_s(select("default")) <= 180
    # Drills that cannot run yet cost nothing and say what they need.
    assert all(d.needs for d in DRILLS if d.estimate_s == 0)


def test_table_lines() -> None:
    rows = table(
        [
            DrillResult("KcopsEngineDown", True, 41.0, "restart_worker", True),
            DrillResult("KcopsEngineOOM", note="not run: needs a memory limit"),
        ]
    )
    assert rows[0].split() == ["alert", "fired", "to", "fire", "action", "taken", "resolved"]
    assert rows[1].split() == ["KcopsEngineDown", "yes", "41s", "restart_worker", "yes"]
    assert rows[2].startswith("KcopsEngineOOM") and "not run: needs a memory limit" in rows[2]


class _Env:
    """The parts of DemoEnv that run_drill uses, with an alert state we choose."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.calls: list[str] = []
        self.load_since: float | None = None
        self.started_at: float | None = None
        self.cooldown_until = 0.0  # the agent's guard on the ladder's target

    def alert_state(self, alertname: str) -> str:
        return self.state

    def cooldowns_left(self) -> dict[str, float]:
        left = self.cooldown_until - time.time()
        return {"notify|notify:KcopsX": left} if left > 0 else {}

    def firing(self, alertname: str) -> bool:
        return self.state == "firing"

    def audit_runs(self, since: float) -> list[dict[str, object]]:
        return [{"action": "notify", "ladder": {"alertname": "KcopsX"}}]

    def route_mode(self) -> str:
        return "normal"


def _drill(env: _Env) -> Drill:
    def start(_: object) -> None:
        env.calls.append("start")
        env.started_at = time.time()
        env.state = "firing"  # the cause fires the alert

    return Drill(
        "KcopsX", "a cause",
        start, lambda _: env.calls.append("stop"),
        fire_within_s=5, estimate_s=1,
        prepare=lambda _: env.calls.append("prepare"),
    )  # fmt: skip


def test_an_alert_active_before_its_cause_is_not_drilled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drills_mod, "QUIET_WITHIN_S", 0.3)
    env = _Env("pending")
    res = drills_mod.run_drill(env, _drill(env))  # type: ignore[arg-type]
    assert not res.fired and "active before its cause" in res.note
    assert env.calls == ["prepare", "stop"]  # the cause was never applied


def test_a_quiet_alert_fired_by_its_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drills_mod, "QUIET_WITHIN_S", 0.3)
    env = _Env("inactive")
    res = drills_mod.run_drill(env, _drill(env))  # type: ignore[arg-type]
    assert res.fired and res.action == "notify" and res.note == ""
    assert env.calls == ["prepare", "start", "stop"]


def test_a_drill_against_a_baseline_waits_for_its_history_of_usual_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(drills_mod, "QUIET_WITHIN_S", 0.3)
    env = _Env("inactive")
    env.load_since = time.time() - 0.2
    base = _drill(env)
    drill = Drill(
        base.alert, base.cause, base.start, base.stop,
        fire_within_s=5, estimate_s=1, history_s=0.8,
    )  # fmt: skip
    res = drills_mod.run_drill(env, drill)  # type: ignore[arg-type]
    assert res.fired and env.started_at is not None
    assert env.started_at >= env.load_since + 0.8  # the cause waited for the history
    assert "compares with a baseline" in capsys.readouterr().out
    # With that much load behind it already, a drill does not wait.
    env.state, env.load_since = "inactive", time.time() - 60
    drills_mod.run_drill(env, drill)  # type: ignore[arg-type]
    assert "compares with a baseline" not in capsys.readouterr().out


def test_the_cause_waits_for_a_cooldown_the_drill_before_left(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two restarts 21 s apart: the second's notify was skipped in its cooldown and the
    # drill saw no action. The cause now waits for the cooldown to run out.
    monkeypatch.setattr(drills_mod, "QUIET_WITHIN_S", 0.3)
    env = _Env("inactive")
    env.cooldown_until = time.time() + 0.6
    res = drills_mod.run_drill(env, _drill(env))  # type: ignore[arg-type]
    assert res.fired and env.started_at is not None and env.started_at >= env.cooldown_until
    # One longer than the demo's own is said, and the drill goes on.
    monkeypatch.setattr(drills_mod, "COOLDOWNS_WITHIN_S", 0.3)
    env.state, env.cooldown_until = "inactive", time.time() + 60
    res = drills_mod.run_drill(env, _drill(env))  # type: ignore[arg-type]
    assert res.fired and "cooldowns still running" in capsys.readouterr().out


def test_actions_text_counts_repeated_steps() -> None:
    assert drills_mod.actions_text([]) is None
    assert drills_mod.actions_text(["notify"]) == "notify"
    assert drills_mod.actions_text(["evict_cache", "evict_cache"]) == "evict_cache x2"
    assert drills_mod.actions_text(["raise_topn", "fallback_to_base"]) == (
        "raise_topn, fallback_to_base"
    )


class _ReliefEnv(_Env):
    """An env whose ladder ran a step, and whose cause the step removes (or not)."""

    def __init__(self, relieved_after: int | None) -> None:
        super().__init__("inactive")
        self.polls = 0
        self.relieved_after = relieved_after

    def relieved(self, _: object) -> bool:
        self.polls += 1
        return self.relieved_after is not None and self.polls >= self.relieved_after


@pytest.mark.parametrize("relieved_after", [2, None])
def test_a_drill_with_a_relief_waits_for_the_action_to_remove_the_cause(
    monkeypatch: pytest.MonkeyPatch, relieved_after: int | None
) -> None:
    monkeypatch.setattr(drills_mod, "QUIET_WITHIN_S", 0.3)
    monkeypatch.setattr(drills_mod, "RELIEF_WITHIN_S", 0.3 if relieved_after is None else 30)
    env = _ReliefEnv(relieved_after)
    base = _drill(env)
    drill = Drill(
        base.alert, base.cause, base.start, base.stop,
        fire_within_s=5, estimate_s=1, relief=env.relieved,
    )  # fmt: skip
    res = drills_mod.run_drill(env, drill)  # type: ignore[arg-type]
    assert res.fired and res.action == "notify"
    if relieved_after is None:
        assert res.relieved is False and "did not relieve" in res.note
    else:
        assert res.relieved is True and res.note == ""
    res.resolved = True
    assert res.ok is (relieved_after is not None)
    assert env.calls == ["start", "stop"]  # relief awaited with the cause applied


def test_demo_rules_cap_for_and_keep_firing_for(tmp_path: Path) -> None:
    from kcops.agent.duration import parse_duration
    from kcops.agent.rules.loader import load_rules
    from kcops.demo.env import DemoEnv

    env = DemoEnv(tmp_path, "tiny", drills_mod.DEMO_PARAMS, max_for="2m", max_keep_firing_for="1m")
    try:
        path = env.write_rules()
    finally:
        env.__exit__()
    demo = {r.name: r for r in load_rules(path, drills_mod.DEMO_PARAMS).alerts()}
    ships = load_rules(packaged_file("rules.yaml"), drills_mod.DEMO_PARAMS).alerts()
    assert set(demo) == {r.name for r in ships}
    for rule in ships:
        got = demo[rule.name]
        assert got.for_s == min(rule.for_s, parse_duration("2m"))
        assert got.keep_firing_for_s == min(rule.keep_firing_for_s, parse_duration("1m"))
        assert got.expr == rule.expr and got.labels == rule.labels  # the rule itself unchanged
