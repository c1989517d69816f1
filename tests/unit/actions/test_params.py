"""Action parameters are strict at the boundary: every action, every typed field."""

from __future__ import annotations

from typing import Any

import pytest

from kcops.agent.actions.base import ActionSpec
from kcops.agent.actions.registry import builtin_actions
from kcops.agent.outcome import ActionRejected

SPECS = builtin_actions().specs()


def _fields(spec: ActionSpec, json_type: str) -> list[str]:
    props = spec.params.model_json_schema().get("properties", {})
    out = []
    for name, prop in props.items():
        types = {prop.get("type")} | {alt.get("type") for alt in prop.get("anyOf", [])}
        if json_type in types:
            out.append(name)
    return out


CASES: list[tuple[str, str, Any]] = []
for _spec in SPECS:
    for _f in _fields(_spec, "boolean"):
        CASES += [(_spec.name, _f, v) for v in ("yes", "false", "true", 1, 0, None)]
    for _f in _fields(_spec, "integer"):
        CASES += [(_spec.name, _f, v) for v in (True, "5", 2.5)]
    for _f in _fields(_spec, "number"):
        CASES += [(_spec.name, _f, v) for v in ("0.5", True)]
    for _f in _fields(_spec, "string"):
        CASES += [(_spec.name, _f, v) for v in (5, True, ["a"])]


def test_every_kind_of_field_is_covered() -> None:
    kinds = {type(v) for _, _, v in CASES}
    assert {str, int, bool} <= kinds
    assert any(f == "drop_running" for _, f, _ in CASES)  # the field the audit showed lax


@pytest.mark.parametrize(("action", "field", "value"), CASES)
def test_a_value_of_the_wrong_type_is_invalid(action: str, field: str, value: Any) -> None:
    spec = builtin_actions().get(action)
    with pytest.raises(ActionRejected) as info:
        spec.parse({field: value})
    assert info.value.reason == "invalid" and field in str(info.value)


def test_right_types_pass_and_an_int_is_a_float() -> None:
    reg = builtin_actions()
    p = reg.get("evict_cache").parse({"fraction": 1, "drop_running": False, "engine": True})
    assert p.fraction == 1.0 and p.drop_running is False  # type: ignore[attr-defined]
    assert reg.get("raise_topn").parse({"step": 8}).step == 8  # type: ignore[attr-defined]


def test_the_refusal_shows_an_excerpt_of_the_value_not_all_of_it() -> None:
    with pytest.raises(ActionRejected) as info:
        builtin_actions().get("notify").parse({"message": "x" * 100_000})
    assert len(str(info.value)) < 1000
