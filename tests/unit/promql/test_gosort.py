"""Go's sort.Sort and container/heap as ported, and Prometheus's tie choices built on them.

The element-for-element comparison with the real Prometheus 2.42 server is
tests/integration/test_prometheus_order.py; these check the port alone.
"""

from __future__ import annotations

import math
import random

import pytest

from kcops.agent.promql.aggregations import aggregate
from kcops.agent.promql.gosort import go_sort, heap_pop, heap_push
from kcops.agent.promql.model import Elem


@pytest.mark.parametrize("n", [0, 1, 2, 7, 12, 13, 49, 50, 51, 200, 1000])
def test_go_sort_sorts_like_any_sort_when_the_order_is_strict(n: int) -> None:
    rng = random.Random(n)
    for shape in ("random", "sorted", "reversed", "sawtooth"):
        data = rng.sample(range(10 * n + 1), n)
        if shape == "sorted":
            data.sort()
        elif shape == "reversed":
            data.sort(reverse=True)
        elif shape == "sawtooth":
            data = [i % 7 * 1000 + i for i in range(n)]
        got = list(data)
        go_sort(got, lambda a, b: a < b)
        assert got == sorted(data), shape


def test_go_sort_with_many_equal_keys_keeps_every_element() -> None:
    rng = random.Random(3)
    data = [(rng.choice([0, 1, 1, 2]), i) for i in range(300)]  # ties on the key
    got = list(data)
    go_sort(got, lambda a, b: a[0] < b[0])
    assert [k for k, _ in got] == sorted(k for k, _ in data)
    assert sorted(got) == sorted(data)


def test_heap_pops_in_order() -> None:
    rng = random.Random(5)
    h: list[int] = []
    values = [rng.randrange(50) for _ in range(200)]
    for v in values:
        heap_push(h, v, lambda a, b: a < b)
    assert [heap_pop(h, lambda a, b: a < b) for _ in values] == sorted(values)


def _vec(values: list[float]) -> list[Elem]:
    return [Elem((("i", str(i)),), v) for i, v in enumerate(values)]


def _ids(vec: list[Elem]) -> list[str]:
    return [e.labels[0][1] for e in vec]


def test_topk_keeps_the_tied_series_prometheus_keeps() -> None:
    # Go's heap over [1, 2, 2, 3, 1]: 1(i0) and 2(i1) go in; 2(i2) evicts i0;
    # 3(i3) evicts the root, i1; so i3 and i2 (a stable pick would keep i1).
    assert _ids(aggregate("topk", None, 2.0, _vec([1, 2, 2, 3, 1]))) == ["3", "2"]
    assert _ids(aggregate("bottomk", None, 2.0, _vec([3, 2, 2, 1, 3]))) == ["3", "2"]


def test_a_nan_root_is_replaced_even_by_a_nan() -> None:
    # Prometheus replaces the root when it is NaN, whatever comes (NaN included).
    nan = math.nan
    assert _ids(aggregate("topk", None, 1.0, _vec([nan, nan, nan]))) == ["2"]
    assert _ids(aggregate("topk", None, 2.0, _vec([nan, 1, nan]))) == ["1", "2"]
