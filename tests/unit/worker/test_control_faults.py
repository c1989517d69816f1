"""Routing / attention budget control and fault requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcops.worker.control import BASE, OPTIMIZED, BadSetting, Control, parse_layers
from kcops.worker.faults import BadFault, Faults, start_delay_s


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
    assert r["after"] == {
        "nan": True,
        "latency_ms": 50.0,
        "token_delay_ms": 0.0,
        "hold_memory_bytes": 1024,
        "memory_ramp": None,
        "hang": False,
        "stall": False,
        "cache_budget_bytes": None,
    }
    f.apply({"hang": True})
    assert not f.unhung.is_set()
    f.apply({"hang": False, "stall": True})  # the loop stays stopped, /health answers
    assert f.stall and not f.hang and not f.unhung.is_set()
    f.apply({"clear": True})
    assert f.state() == {
        "nan": False,
        "latency_ms": 0.0,
        "token_delay_ms": 0.0,
        "hold_memory_bytes": 0,
        "memory_ramp": None,
        "hang": False,
        "stall": False,
        "cache_budget_bytes": None,
    }
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


def test_cache_budget_fault_resizes_and_clear_puts_it_back() -> None:
    f = Faults()
    with pytest.raises(BadFault, match="no KV cache"):
        f.apply({"cache_budget_bytes": 1024})
    seen: list[int | None] = []
    f.resize_cache = seen.append
    assert f.apply({"cache_budget_bytes": 1 << 30})["after"]["cache_budget_bytes"] == 1 << 30
    for bad in (-1, 1.5, True):
        with pytest.raises(BadFault, match="cache_budget_bytes"):
            f.apply({"cache_budget_bytes": bad})
    f.apply({"cache_budget_bytes": 0})  # back to the configured budget
    f.apply({"cache_budget_bytes": 4096})
    f.apply({"clear": True})
    assert seen == [1 << 30, None, 4096, None] and f.cache_budget_bytes is None


def test_token_delay_validated_and_cleared() -> None:
    f = Faults()
    assert f.apply({"token_delay_ms": 300})["after"]["token_delay_ms"] == 300.0
    for bad in ({"token_delay_ms": -5}, {"token_delay_ms": True}, {"token_delay_ms": 10**9}):
        with pytest.raises(BadFault, match="token_delay_ms"):
            f.apply(bad)
    assert f.token_delay_ms == 300.0
    f.apply({"clear": True})
    assert f.token_delay_ms == 0.0


def test_memory_ramp_grows_with_time_up_to_its_cap() -> None:
    mib = 1024**2
    f = Faults()
    f.apply({"memory_ramp_bytes_per_s": 8 * mib, "memory_ramp_to_bytes": 40 * mib})
    f.tick(100.0)  # the first tick starts the ramp: nothing due yet
    assert f.held_bytes == 0
    f.tick(100.25)  # 2 MiB due: less than a step, not allocated yet
    assert f.held_bytes == 0
    f.tick(101.0)
    assert f.held_bytes == 8 * mib
    f.tick(103.0)
    assert f.held_bytes == 24 * mib
    assert f.state()["hold_memory_bytes"] == 24 * mib
    f.tick(200.0)  # capped
    assert f.held_bytes == 40 * mib
    # The held memory is real: bytes written, not a number.
    assert f.ramp is not None and all(b[-1] == 1 for b in f.ramp.held)
    f.apply({"memory_ramp_bytes_per_s": 0})  # stops the ramp and frees what it held
    assert f.ramp is None and f.held_bytes == 0


def test_memory_ramp_needs_a_cap() -> None:
    f = Faults()
    for bad in (
        {"memory_ramp_bytes_per_s": 1024},
        {"memory_ramp_to_bytes": 1024},
        {"memory_ramp_bytes_per_s": -1, "memory_ramp_to_bytes": 1024},
    ):
        with pytest.raises(BadFault, match="memory_ramp"):
            f.apply(bad)
    assert f.ramp is None


def test_start_delay_file(tmp_path: Path) -> None:
    p = tmp_path / "delay"
    assert start_delay_s(p) == 0.0  # missing: no delay
    p.write_text("")
    assert start_delay_s(p) == 0.0
    p.write_text("150\n")
    assert start_delay_s(p) == 150.0
    for bad in ("soon", "-1", "nan", "1e9"):
        p.write_text(bad)
        with pytest.raises(BadFault, match="expected seconds"):
            start_delay_s(p)
