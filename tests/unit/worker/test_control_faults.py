"""Routing / attention budget control and fault requests."""

from __future__ import annotations

import pytest

from kcops.worker.control import BASE, OPTIMIZED, BadSetting, Control, parse_layers
from kcops.worker.faults import BadFault, Faults


def test_route_by_threshold_and_fallback() -> None:
    c = Control(long_threshold=100, top_n=32, num_layers=4)
    assert c.route(99) == BASE and c.route(100) == OPTIMIZED
    assert c.set_mode("fallback") == ("normal", "fallback")
    assert c.route(10_000) == BASE
    with pytest.raises(BadSetting, match="normal, fallback"):
        c.set_mode("off")


def test_policy_follows_budget() -> None:
    c = Control(top_n=32, dense_layers=frozenset({0}), num_layers=4)
    assert c.policy(BASE).n_for_layer(2) is None
    p = c.policy(OPTIMIZED)
    assert p.n_for_layer(0) is None and p.n_for_layer(3) == 32
    before, after = c.set_budget(top_n=64, top_n_by_layer={"2": 16}, dense_layers=[0, 1])
    assert before.top_n == 32 and after.as_json() == {
        "top_n": 64,
        "top_n_by_layer": {"2": 16},
        "dense_layers": [0, 1],
    }
    assert c.policy(OPTIMIZED).n_for_layer(2) == 16


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"top_n": 8}, r"\[16, 1024\]"),
        ({"top_n": 2048}, r"\[16, 1024\]"),
        ({"top_n": "64"}, "integer"),
        ({"top_n_by_layer": {"9": 32}}, "layer 9"),
        ({"top_n_by_layer": {"1": 4}}, r"\[16, 1024\]"),
        ({"dense_layers": "0,1"}, "list"),
        ({}, "give top_n"),
    ],
)
def test_budget_bounds(kw: dict[str, object], match: str) -> None:
    c = Control(top_n=64, num_layers=4)
    with pytest.raises(BadSetting, match=match):
        c.set_budget(**kw)
    assert c.budget.top_n == 64


def test_parse_layers() -> None:
    assert parse_layers("0,1") == frozenset({0, 1}) and parse_layers("") == frozenset()
    with pytest.raises(BadSetting):
        parse_layers("a")


def test_faults_apply_and_clear() -> None:
    f = Faults()
    r = f.apply({"nan": True, "latency_ms": 50, "hold_memory_bytes": 1024})
    assert r["before"]["nan"] is False
    assert r["after"] == {"nan": True, "latency_ms": 50.0, "hold_memory_bytes": 1024, "hang": False}
    f.apply({"hang": True})
    assert not f.unhung.is_set()
    f.apply({"clear": True})
    assert f.state() == {"nan": False, "latency_ms": 0.0, "hold_memory_bytes": 0, "hang": False}
    assert f.unhung.is_set()
    for bad in ({}, {"latency_ms": -1}, {"hold_memory_bytes": "x"}, {"explode": True}, [1]):
        with pytest.raises(BadFault):
            f.apply(bad)
    # A refused request changes nothing, even its valid parts.
    f.apply({"nan": True})
    for bad in ({"clear": True, "latency_ms": float("nan")}, {"latency_ms": float("inf")}):
        with pytest.raises(BadFault):
            f.apply(bad)
    assert f.state()["nan"] is True
