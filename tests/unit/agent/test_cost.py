"""Issue 25 part 3: prices, the derived cost counters and ``kcops cost``'s table."""

from __future__ import annotations

import pytest

from kcops.agent.config import parse_config
from kcops.agent.cost import cost_samples
from kcops.agent.samples import Sample
from kcops.cli.cost import CostRow, gather, render_html, render_text, totals
from kcops.errors import ConfigError


def test_prices_per_1k_or_per_device_hour() -> None:
    cfg = parse_config(
        {
            "cost": {
                "prices": {
                    "tiny": {"per_1k_context_tokens": 0.002},
                    "*": {"per_device_hour": 4.0, "context_tokens_per_device_hour": 2_000_000},
                }
            }
        }
    )
    assert cfg.cost.per_1k() == {"tiny": 0.002, "*": 0.002}


@pytest.mark.parametrize(
    "price",
    [
        {},
        {"per_1k_context_tokens": 1.0, "per_device_hour": 2.0},
        {"per_device_hour": 2.0},
        {"per_1k_context_tokens": -1.0},
        {"per_1k_context_tokens": ".inf"},
    ],
)
def test_bad_prices_are_refused_in_one_line(price: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"cost": {"prices": {"tiny": price}}})
    assert "cost.prices.tiny" in str(err.value) and "\n" not in str(err.value)


def test_cost_counters_scale_the_token_counters() -> None:
    lab = {"engine": "kcops", "model": "tiny", "tenant": "acme"}
    other = {**lab, "model": "unpriced"}
    samples = [
        Sample.of("kcops_request_context_tokens_sum", 12_000, lab),
        Sample.of("kcops_request_priced_effective_tokens_total", 3_000, lab),
        Sample.of("kcops_request_context_tokens_count", 7, lab),
        Sample.of("kcops_request_context_tokens_sum", 500, other),
    ]
    got = {(s.name, dict(s.labels)["model"]): s.value for s in cost_samples(samples, {"tiny": 0.5})}
    assert got == {
        ("kcops_cost_full_total", "tiny"): 6.0,
        ("kcops_cost_effective_total", "tiny"): 1.5,
    }
    assert cost_samples(samples, {}) == []  # no price: no cost series, never 0
    anymodel = cost_samples(samples, {"*": 1.0})
    assert {dict(s.labels)["model"] for s in anymodel} == {"tiny", "unpriced"}


class FakeAgent:
    """The agent's query API for ``gather``: counters at the window's start and end."""

    def __init__(self, start: dict[str, dict[str, float]], end: dict[str, dict[str, float]]):
        self.start, self.end = start, end

    def vector(self, expr: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        if expr.startswith("resets("):
            return []
        name = expr.split("(")[-1].split("[")[0] if "(" in expr else expr
        table = self.end if expr.startswith("last_over_time(") else self.start
        return [
            ({"__name__": name, "model": "tiny", "tenant": t, "engine": "kcops"}, v)
            for t, v in table.get(name, {}).items()
        ]


def test_the_table_adds_up() -> None:
    end = {
        "kcops_request_context_tokens_count": {"acme": 10, "globex": 4, "initech": 1},
        "kcops_request_effective_context_tokens_count": {"acme": 6, "globex": 4},
        "kcops_request_context_tokens_sum": {"acme": 5000, "globex": 900, "initech": 30},
        "kcops_request_priced_effective_tokens_total": {
            "acme": 1234.5,
            "globex": 99,
            "initech": 30,
        },
        "kcops_cost_full_total": {"acme": 10.0, "globex": 1.8, "initech": 0.06},
        "kcops_cost_effective_total": {"acme": 2.469, "globex": 0.198, "initech": 0.06},
    }
    # acme existed before the window: its start values are taken off; the others were born in it
    start = {
        "kcops_request_context_tokens_count": {"acme": 2},
        "kcops_request_effective_context_tokens_count": {"acme": 1},
        "kcops_request_context_tokens_sum": {"acme": 1000},
        "kcops_request_priced_effective_tokens_total": {"acme": 234.5},
        "kcops_cost_full_total": {"acme": 2.0},
        "kcops_cost_effective_total": {"acme": 0.469},
    }
    rows = gather(FakeAgent(start, end), 0.0, 3600.0)
    assert [r.tenant for r in rows] == ["acme", "globex", "initech"]
    acme = rows[0]
    assert (acme.queries, acme.sampled, acme.context_tokens) == (8, 5, 4000)
    assert acme.cost_full == pytest.approx(8.0) and acme.saving == pytest.approx(6.0)
    total = totals(rows)
    assert total.cost_full == pytest.approx(sum(r.cost_full or 0 for r in rows))
    assert total.cost_effective == pytest.approx(sum(r.cost_effective or 0 for r in rows))
    assert total.saving == pytest.approx(total.cost_full - total.cost_effective)
    assert total.saving == pytest.approx(sum(r.saving or 0 for r in rows))
    assert total.queries == 13 and total.context_tokens == 4930
    text = render_text(rows)
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["model", "tenant"] and lines[-1].startswith("total")
    assert "9.860000" in lines[-1]  # 8 + 1.8 + 0.06
    assert "globex" in render_html(rows) and "total" in render_html(rows)


def test_an_unpriced_model_shows_tokens_and_no_cost() -> None:
    rows = [CostRow("m", "a", 1, 1, 10, 5), CostRow("m", "b", 2, 0, 20, 20, 2.0, 2.0)]
    total = totals(rows)
    assert total.cost_full == 2.0 and total.saving == 0.0 and rows[0].saving is None
    assert "—" in render_text(rows)
