"""Go 1.19's ``sort.Sort`` (pdqsort) and ``container/heap``, step for step.

Prometheus 2.42 picks topk/bottomk elements with ``container/heap`` and orders
them, and ``sort``/``sort_desc``, with ``sort.Sort``. Neither is stable, and
their ``Less`` treats NaN as smaller than everything, so the order of ties and
of NaNs is whatever these exact algorithms do: ported here so that kcops gives
the same answer from the same input order. Everything works on a Python list
and ``less(a, b)``, the element form of Go's ``Interface.Less(i, j)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
Less = Callable[[T, T], bool]
_MAX_INSERTION = 12
_SHORTEST_NINTHER = 50
_MAX_SWAPS = 4 * 3
_MASK64 = (1 << 64) - 1
_INCREASING, _DECREASING, _UNKNOWN = 1, 2, 0


# -- container/heap ------------------------------------------------------------


def _up(h: list[T], j: int, less: Less[T]) -> None:
    while j > 0:
        i = (j - 1) // 2
        if not less(h[j], h[i]):
            break
        h[i], h[j] = h[j], h[i]
        j = i


def _down(h: list[T], i0: int, n: int, less: Less[T]) -> bool:
    i = i0
    while True:
        j1 = 2 * i + 1
        if j1 >= n:
            break
        j = j1
        j2 = j1 + 1
        if j2 < n and less(h[j2], h[j1]):
            j = j2
        if not less(h[j], h[i]):
            break
        h[i], h[j] = h[j], h[i]
        i = j
    return i > i0


def heap_push(h: list[T], x: T, less: Less[T]) -> None:
    """``heap.Push``: append, then sift up."""
    h.append(x)
    _up(h, len(h) - 1, less)


def heap_pop(h: list[T], less: Less[T]) -> T:
    """``heap.Pop``: the least element, after moving the last one to the root."""
    n = len(h) - 1
    h[0], h[n] = h[n], h[0]
    _down(h, 0, n, less)
    return h.pop()


# -- sort.Sort (pdqsort) ---------------------------------------------------------


def go_sort(data: list[T], less: Less[T]) -> None:
    """``sort.Sort(data)`` in place, with ``less`` as ``data.Less``."""
    n = len(data)
    if n > 1:
        _pdqsort(data, 0, n, n.bit_length(), less)


def _insertion_sort(d: list[T], a: int, b: int, less: Less[T]) -> None:
    for i in range(a + 1, b):
        j = i
        while j > a and less(d[j], d[j - 1]):
            d[j], d[j - 1] = d[j - 1], d[j]
            j -= 1


def _sift_down(d: list[T], lo: int, hi: int, first: int, less: Less[T]) -> None:
    root = lo
    while True:
        child = 2 * root + 1
        if child >= hi:
            return
        if child + 1 < hi and less(d[first + child], d[first + child + 1]):
            child += 1
        if not less(d[first + root], d[first + child]):
            return
        d[first + root], d[first + child] = d[first + child], d[first + root]
        root = child


def _heap_sort(d: list[T], a: int, b: int, less: Less[T]) -> None:
    first, hi = a, b - a
    for i in range((hi - 1) // 2, -1, -1):
        _sift_down(d, i, hi, first, less)
    for i in range(hi - 1, -1, -1):
        d[first], d[first + i] = d[first + i], d[first]
        _sift_down(d, 0, i, first, less)


def _pdqsort(d: list[T], a: int, b: int, limit: int, less: Less[T]) -> None:
    balanced, partitioned = True, True
    while True:
        length = b - a
        if length <= _MAX_INSERTION:
            _insertion_sort(d, a, b, less)
            return
        if limit == 0:
            _heap_sort(d, a, b, less)
            return
        if not balanced:
            _break_patterns(d, a, b)
            limit -= 1
        pivot, hint = _choose_pivot(d, a, b, less)
        if hint == _DECREASING:
            _reverse_range(d, a, b)
            pivot = (b - 1) - (pivot - a)
            hint = _INCREASING
        if (
            balanced
            and partitioned
            and hint == _INCREASING
            and _partial_insertion_sort(d, a, b, less)
        ):
            return
        if a > 0 and not less(d[a - 1], d[pivot]):
            a = _partition_equal(d, a, b, pivot, less)
            continue
        mid, partitioned = _partition(d, a, b, pivot, less)
        left, right = mid - a, b - mid
        threshold = length // 8
        if left < right:
            balanced = left >= threshold
            _pdqsort(d, a, mid, limit, less)
            a = mid + 1
        else:
            balanced = right >= threshold
            _pdqsort(d, mid + 1, b, limit, less)
            b = mid


def _partition(d: list[T], a: int, b: int, pivot: int, less: Less[T]) -> tuple[int, bool]:
    d[a], d[pivot] = d[pivot], d[a]
    i, j = a + 1, b - 1
    while i <= j and less(d[i], d[a]):
        i += 1
    while i <= j and not less(d[j], d[a]):
        j -= 1
    if i > j:
        d[j], d[a] = d[a], d[j]
        return j, True
    d[i], d[j] = d[j], d[i]
    i, j = i + 1, j - 1
    while True:
        while i <= j and less(d[i], d[a]):
            i += 1
        while i <= j and not less(d[j], d[a]):
            j -= 1
        if i > j:
            break
        d[i], d[j] = d[j], d[i]
        i, j = i + 1, j - 1
    d[j], d[a] = d[a], d[j]
    return j, False


def _partition_equal(d: list[T], a: int, b: int, pivot: int, less: Less[T]) -> int:
    d[a], d[pivot] = d[pivot], d[a]
    i, j = a + 1, b - 1
    while True:
        while i <= j and not less(d[a], d[i]):
            i += 1
        while i <= j and less(d[a], d[j]):
            j -= 1
        if i > j:
            return i
        d[i], d[j] = d[j], d[i]
        i, j = i + 1, j - 1


def _partial_insertion_sort(d: list[T], a: int, b: int, less: Less[T]) -> bool:
    max_steps, shortest_shifting = 5, 50
    i = a + 1
    for _ in range(max_steps):
        while i < b and not less(d[i], d[i - 1]):
            i += 1
        if i == b:
            return True
        if b - a < shortest_shifting:
            return False
        d[i], d[i - 1] = d[i - 1], d[i]
        if i - a >= 2:  # shift the smaller one to the left
            for j in range(i - 1, 0, -1):
                if not less(d[j], d[j - 1]):
                    break
                d[j], d[j - 1] = d[j - 1], d[j]
        if b - i >= 2:  # shift the greater one to the right
            for j in range(i + 1, b):
                if not less(d[j], d[j - 1]):
                    break
                d[j], d[j - 1] = d[j - 1], d[j]
    return False


def _break_patterns(d: list[T], a: int, b: int) -> None:
    length = b - a
    if length < 8:
        return
    r = length  # xorshift seeded with the length, as Go does
    modulus = 1 << length.bit_length()
    for idx in range(a + (length // 4) * 2 - 1, a + (length // 4) * 2 + 2):
        # Go 1.19's shifts (13, 17, 5); later Go uses (13, 7, 17). Checked
        # against the sort() answers of the prometheus 2.42 binary here.
        r ^= (r << 13) & _MASK64
        r ^= r >> 17
        r ^= (r << 5) & _MASK64
        other = r & (modulus - 1)
        if other >= length:
            other -= length
        d[idx], d[a + other] = d[a + other], d[idx]


def _choose_pivot(d: list[T], a: int, b: int, less: Less[T]) -> tuple[int, int]:
    n = b - a
    swaps = [0]
    i, j, k = a + n // 4 * 1, a + n // 4 * 2, a + n // 4 * 3
    if n >= 8:
        if n >= _SHORTEST_NINTHER:
            i = _median(d, i - 1, i, i + 1, swaps, less)
            j = _median(d, j - 1, j, j + 1, swaps, less)
            k = _median(d, k - 1, k, k + 1, swaps, less)
        j = _median(d, i, j, k, swaps, less)
    if swaps[0] == 0:
        return j, _INCREASING
    if swaps[0] == _MAX_SWAPS:
        return j, _DECREASING
    return j, _UNKNOWN


def _order2(d: list[T], a: int, b: int, swaps: list[int], less: Less[T]) -> tuple[int, int]:
    if less(d[b], d[a]):
        swaps[0] += 1
        return b, a
    return a, b


def _median(d: list[T], a: int, b: int, c: int, swaps: list[int], less: Less[T]) -> int:
    a, b = _order2(d, a, b, swaps, less)
    b, c = _order2(d, b, c, swaps, less)
    a, b = _order2(d, a, b, swaps, less)
    return b


def _reverse_range(d: list[T], a: int, b: int) -> None:
    i, j = a, b - 1
    while i < j:
        d[i], d[j] = d[j], d[i]
        i, j = i + 1, j - 1
