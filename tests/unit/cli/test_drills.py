"""The demo's drill table: selection, estimates, and every alert of the rule file covered."""

from __future__ import annotations

import click
import pytest
import yaml

from kcops.cli.drills import DRILLS, DrillResult, estimate_s, select, table


def test_every_alert_of_the_table_has_a_drill() -> None:
    from kcops.alerts import packaged_file

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
