"""Prices, the derived cost counters, the estimate of unsampled requests' effective
context and ``kcops cost``'s table."""

from __future__ import annotations

import math
import random

import pytest

from kcops.agent.config import parse_config
from kcops.agent.cost import MIN_SAMPLED, Traffic, cost_samples, estimate, sum_sq
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
    samples.append(Sample.of("kcops_request_effective_context_tokens_count", 2, lab))
    got = {(s.name, dict(s.labels)["model"]): s.value for s in cost_samples(samples, {"tiny": 0.5})}
    assert got == {
        ("kcops_cost_full_total", "tiny"): 6.0,
        ("kcops_cost_effective_total", "tiny"): 1.5,
        ("kcops_request_measured_ratio", "tiny"): 2 / 7,
    }
    # no price: no cost series, never 0; the measured share all the same
    assert [s.name for s in cost_samples(samples, {})] == ["kcops_request_measured_ratio"]
    anymodel = [s for s in cost_samples(samples, {"*": 1.0}) if s.name.startswith("kcops_cost")]
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
        "kcops_request_effective_context_tokens_sum": {"acme": 634.5, "globex": 99},
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
        "kcops_request_effective_context_tokens_sum": {"acme": 34.5},
        "kcops_request_context_tokens_sum": {"acme": 1000},
        "kcops_request_priced_effective_tokens_total": {"acme": 234.5},
        "kcops_cost_full_total": {"acme": 2.0},
        "kcops_cost_effective_total": {"acme": 0.469},
    }
    rows = gather(FakeAgent(start, end), 0.0, 3600.0)
    assert [r.tenant for r in rows] == ["acme", "globex", "initech"]
    acme = rows[0]
    assert (acme.queries, acme.sampled, acme.context_tokens) == (8, 5, 4000)
    assert acme.cost_full == pytest.approx(8.0)
    # acme's 5 sampled requests: 600 effective tokens of 3600 full (the priced 1000 less
    # their 600: the 3 others' 400 full tokens), so the others are priced at 400 / 6
    assert acme.conservative_tokens == pytest.approx(1000.0)
    assert acme.cost_conservative == pytest.approx(2.0)  # the counter: unsampled at full
    assert acme.effective_tokens == pytest.approx(600 + 400 / 6)
    assert acme.cost_effective == pytest.approx(8.0 * (600 + 400 / 6) / 4000)
    assert acme.saving == pytest.approx(8.0 - acme.cost_effective)
    assert acme.measured_share == pytest.approx(5 / 8) and acme.ratio_of == "tenant"
    # initech: one request, none sampled, borrows the model's ratio (globex's 99/900, acme's)
    initech = rows[2]
    assert initech.ratio_of == "model" and initech.effective_tokens < 30
    assert initech.effective_tokens_low == 0 and initech.effective_tokens_high == 30
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


def chat(
    seed: int, n: int = 400, rate: float = 0.003, layers: int = 30
) -> list[tuple[int, float, bool]]:
    """Chat-like requests as the probe meets them: (full context, effective context,
    sampled). Prompts of 150-900 tokens in chunks of 256 and 1-9 tokens out, so a long
    prompt makes more attention calls and is sampled more often; the effective context
    grows slower than the full (a fixed part, sinks and recent window, and a share)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt, answer = rng.randint(150, 900), rng.randint(1, 9)
        calls = layers * (math.ceil(prompt / 256) + answer)
        full = prompt + answer
        effective = min(full, (100 + 0.1 * full) * rng.lognormvariate(0, 0.3))
        out.append((full, effective, rng.random() < 1 - (1 - rate) ** calls))
    return out


def traffic_of(reqs: list[tuple[int, float, bool]]) -> Traffic:
    sampled = [(f, e) for f, e, k in reqs if k]
    return Traffic(
        requests=len(reqs),
        full=sum(f for f, _, _ in reqs),
        full_sq=sum(f * f for f, _, _ in reqs),
        sampled=len(sampled),
        effective=sum(e for _, e in sampled),
        effective_sq=sum(e * e for _, e in sampled),
        priced=sum(e if k else f for f, e, k in reqs),
    )


def test_the_estimate_finds_the_effective_share_where_naive_figures_do_not() -> None:
    """Long requests sampled more, their ratio lower: the estimate is within 0.03 of the
    truth in every seed and its interval holds it in most; pricing the unsampled at full
    context, or at the sampled requests' mean ratio, is off."""
    errors, naive_mean, conservative, held = [], [], [], 0
    for seed in range(60):
        reqs = chat(seed)
        w = traffic_of(reqs)
        truth = sum(e for _, e, _ in reqs) / w.full
        est = estimate({("m", "t"): w})[("m", "t")]
        errors.append(est.tokens / w.full - truth)
        held += est.low / w.full <= truth <= est.high / w.full
        ratios = [e / f for f, e, k in reqs if k]
        naive_mean.append(sum(ratios) / len(ratios) - truth)
        conservative.append(w.priced / w.full - truth)
        assert est.ratio_of == "tenant" and w.sampled < w.requests
    assert max(map(abs, errors)) < 0.03 and abs(sum(errors) / len(errors)) < 0.01
    assert sum(naive_mean) / len(naive_mean) > 0.025  # short requests' high ratios overweighted
    assert min(conservative) > 0.2
    assert held >= 0.9 * 60


def test_every_request_sampled_is_the_measurement_itself() -> None:
    reqs = [(f, e, True) for f, e, _ in chat(1, n=50)]
    w = traffic_of(reqs)
    est = estimate({("m", "t"): w})[("m", "t")]
    assert est.tokens == pytest.approx(w.effective) == pytest.approx(w.priced)
    assert est.low == pytest.approx(est.tokens) == pytest.approx(est.high)


def test_a_thin_tenant_borrows_its_models_ratio_then_everyones() -> None:
    big = traffic_of(chat(2))
    thin = Traffic(requests=10, full=5000, full_sq=2.6e6, sampled=2, effective=200,
                  effective_sq=20_000, priced=200 + 4000)  # fmt: skip
    nothing = Traffic(requests=3, full=900, full_sq=270_000, priced=900)
    got = estimate({("m", "big"): big, ("m", "thin"): thin, ("other", "x"): nothing})
    assert thin.sampled < MIN_SAMPLED and got["m", "thin"].ratio_of == "model"
    pooled = (big + thin).effective / (big + thin).sampled_full
    assert got["m", "thin"].tokens == pytest.approx(200 + pooled * 4000)
    other = got["other", "x"]  # no model-mate sampled: everyone's ratio
    assert other.ratio_of == "all" and other.tokens == pytest.approx(900 * pooled)
    assert 0 <= other.low <= other.tokens <= other.high <= 900
    # nobody sampled anything: the conservative figure, between nothing and full context
    alone = estimate({("other", "x"): nothing})["other", "x"]
    assert (alone.tokens, alone.low, alone.high, alone.ratio_of) == (900, 0, 900, "none")


def test_sums_of_squares_from_buckets() -> None:
    # two observations in (0, 8], one in (8, 16], one past the last bound (16)
    cumulative = {8.0: 2, 16.0: 3, math.inf: 4}
    assert sum_sq(cumulative) == pytest.approx(2 * 64 / 3 + (64 + 128 + 256) / 3 + 256)
    assert sum_sq({}) == 0.0
