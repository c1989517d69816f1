"""Alert ``for`` state across restarts: Prometheus's restore rule, the file, and the component."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
import yaml

from kcops.agent import rules
from kcops.agent.events import AlertTransition
from kcops.agent.rules.component import RulesComponent
from kcops.agent.rules.forstate import (
    FILE_NAME,
    MAX_ENTRIES,
    ForState,
    encode_saved,
    read_saved,
    restored_active_at,
)
from tests.unit.rules.test_component import T0, make_ctx

# (active_at, down_at, ts, hold, grace) -> restored active_at; times relative to 0.
CASES = [
    # pending 20 s of 30, down 5 s, grace 10 s: 10 s are left -> shifted by the downtime
    ("shift by downtime", (0, 20, 25, 30, 10), 5),
    # 25 s of 30 done, 5 s left < grace 10 s: exactly the grace is left after ts
    ("grace left", (0, 25, 40, 30, 10), 40 + 10 - 30),
    # remaining == grace is not < grace: shifted
    ("remaining equals grace", (0, 20, 30, 30, 10), 10),
    # it was firing (remaining <= 0): ActiveAt kept, fires at the next evaluation
    ("was firing", (0, 45, 60, 30, 10), 0),
    ("fired exactly", (0, 30, 60, 30, 10), 0),
    # Prometheus's default grace 10m with a 1h for, down 1 minute
    ("long for", (0, 600, 660, 3600, 600), 60),
    ("long for near the end", (0, 3500, 3560, 3600, 600), 3560 + 600 - 3600),
]


@pytest.mark.parametrize(("args", "want"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_restore_rule_is_prometheus_s(args: tuple[float, ...], want: float) -> None:
    active_at, down_at, ts, hold, grace = args
    got = restored_active_at(active_at, down_at, ts, hold, grace)
    assert got == want
    remaining_after = hold - (ts - got)
    if hold - (down_at - active_at) > 0:
        assert remaining_after >= min(grace, hold - (down_at - active_at))


def _rule_file(tmp_path: Path, for_: str = "30s", interval: str | None = None) -> Path:
    group: dict[str, object] = {
        "name": "g",
        "rules": [{"alert": "Always", "expr": "vector(1)", "for": for_}],
    }
    if interval:
        group["interval"] = interval
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


def _component(tmp_path: Path, rule_file: Path, **cfg: object) -> RulesComponent:
    (comp,) = rules.build(make_ctx(tmp_path, {"file": str(rule_file), **cfg}))
    return comp


def _tick_until(
    comp: RulesComponent, start: float, end: float, seen: list[AlertTransition]
) -> None:
    comp.ctx.bus.subscribe(seen.append)

    async def run() -> None:
        t = start
        while t < end:
            await comp.tick(t)
            t += 1
        await comp.stop()

    asyncio.run(run())


def _fired_at(seen: list[AlertTransition]) -> float:
    return next(tr.t for tr in seen if tr.state == "firing")


@pytest.mark.parametrize(
    ("pending_s", "down_s", "grace", "for_", "want_fire_after_back"),
    [
        # the acceptance case: 20 s into a 30 s for, restarted: 10 s are left (+2 ticks
        # before the restore, as Prometheus restores after the second evaluation)
        (20, 5, "10s", "30s", 1 + 10),
        # 25 s in: 5 s left < grace 10 s, so 10 s from the restore
        (25, 5, "10s", "30s", 1 + 10),
        # a for shorter than the grace is not restored: the whole for again
        (20, 5, "1m", "30s", 30),
        # down longer than the outage tolerance: not restored
        (20, 120, "10s", "30s", 30),
    ],
)
def test_a_restarted_component_restores_the_for_state(
    tmp_path: Path,
    pending_s: int,
    down_s: int,
    grace: str,
    for_: str,
    want_fire_after_back: float,
) -> None:
    rule_file = _rule_file(tmp_path, for_)
    cfg = {"for_grace_period_s": grace, "for_outage_tolerance_s": "1m"}
    first = _component(tmp_path, rule_file, **cfg)
    seen1: list[AlertTransition] = []
    _tick_until(first, T0, T0 + pending_s + 1, seen1)
    assert [tr.state for tr in seen1] == ["pending"]
    saved = read_saved(tmp_path / FILE_NAME)
    (st,) = saved["Always"].values()
    assert st == ForState(T0, T0 + pending_s)

    back = T0 + pending_s + down_s
    second = _component(tmp_path, rule_file, **cfg)
    seen2: list[AlertTransition] = []
    _tick_until(second, back, back + 40, seen2)
    assert _fired_at(seen2) - back == want_fire_after_back


def test_the_state_file_follows_the_alerts_and_is_left_alone_before_the_restore(
    tmp_path: Path,
) -> None:
    rule_file = _rule_file(tmp_path, "30s")
    first = _component(tmp_path, rule_file)
    _tick_until(first, T0, T0 + 3, [])
    before = (tmp_path / FILE_NAME).read_bytes()
    second = _component(tmp_path, rule_file)

    async def one() -> None:
        await second.tick(T0 + 100)  # first evaluation: not restored yet, file unchanged

    asyncio.run(one())
    assert (tmp_path / FILE_NAME).read_bytes() == before


def test_a_rule_no_longer_in_the_file_is_dropped_and_a_resolved_alert_removed(
    tmp_path: Path,
) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(
        encode_saved(
            {
                "Gone": {(("alertname", "Gone"),): ForState(T0, T0)},
                "Always": {(("alertname", "Always"),): ForState(T0, T0)},
            }
        )
    )
    rule_file = tmp_path / "rules.yaml"
    rule_file.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "g", "rules": [{"alert": "Always", "expr": "vector(0) > 1"}]}]}
        )
    )
    comp = _component(tmp_path, rule_file)
    assert set(comp.for_state.saved) == {"Always"}
    _tick_until(comp, T0 + 1, T0 + 4, [])
    assert json.loads(path.read_text())["alerts"] == []


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"version": 2, "alerts": []}',
        b'{"version": 1, "alerts": [{"rule": "A", "labels": {}, "active_at": "x", "seen_at": 1}]}',
        b'{"version": 1, "alerts": [], "extra": 1}',
        b'{"version": 1, "alerts": [{"rule": "A", "labels": {}, "active_at": 1e999, '
        b'"seen_at": 1}]}',
        b" " * (9 << 20),
    ],
    ids=["not-json", "version", "type", "extra-key", "infinite", "too-large"],
)
def test_a_corrupt_file_is_set_aside_with_a_log_line_never_fatal(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="kcops.agent.rules"):
        comp = _component(tmp_path, _rule_file(tmp_path))
    assert comp.for_state.saved == {}
    assert not path.exists()
    assert (tmp_path / (FILE_NAME + ".corrupt")).read_bytes() == content
    assert any("is corrupt" in r.getMessage() for r in caplog.records)
    _tick_until(comp, T0, T0 + 3, [])  # and the agent carries on, writing a good file
    assert read_saved(path)


def test_the_file_is_bounded_and_written_atomically(tmp_path: Path) -> None:
    many = {
        "A": {(("alertname", "A"), ("i", str(i))): ForState(T0, T0) for i in range(MAX_ENTRIES + 5)}
    }
    doc = json.loads(encode_saved(many))
    assert len(doc["alerts"]) == MAX_ENTRIES
    path = tmp_path / FILE_NAME
    (tmp_path / f".{FILE_NAME}.123.tmp").write_text("left by a crash")
    comp = _component(tmp_path, _rule_file(tmp_path))
    _tick_until(comp, T0, T0 + 2, [])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert read_saved(path)["Always"]


def test_a_non_finite_time_is_not_saved_and_the_file_stays_strict_json() -> None:
    """Issue 24, strict data: no bare NaN/Infinity in any file the agent writes."""
    import json
    import math

    from kcops.agent.rules.forstate import ForState, encode_saved

    saved = {
        "A": {
            (("alertname", "A"),): ForState(100.0, 101.0),
            (("alertname", "A"), ("pod", "x")): ForState(math.nan, 101.0),
            (("alertname", "A"), ("pod", "y")): ForState(100.0, math.inf),
        }
    }
    text = encode_saved(saved).decode()  # type: ignore[arg-type]
    doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert [e["labels"] for e in doc["alerts"]] == [{"alertname": "A"}]
