"""The grouped NaN/Inf check: every call counted, per kind, at group end or drain."""

from __future__ import annotations

import pytest
import torch

from kcops.kernels.aggregate import Aggregator
from kcops.kernels.errcheck import GROUP_CALLS, SMALL_NUMEL, ErrorCheck


def _counts(agg: Aggregator) -> dict[str, int]:
    return {k: agg.errors[k] for k in ("nan", "inf")}


def _decode_out(bad: float | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    t = torch.randn(1, 1, 9, 64).to(dtype)  # one SmolLM2 decode row: 9 heads x 64
    if bad is not None:
        t[0, 0, 4, 7] = bad
    return t


def test_small_outputs_wait_for_their_group_then_count_each_bad_call() -> None:
    agg = Aggregator((16,))
    check = ErrorCheck(agg)
    bad_at = {3: float("nan"), 10: float("inf"), 20: float("nan")}
    for i in range(GROUP_CALLS - 1):
        check.check(_decode_out(bad_at.get(i)))
    assert _counts(agg) == {"nan": 0, "inf": 0}  # pending: no reduction yet
    check.check(_decode_out())  # the group is full: checked now, without a drain
    assert _counts(agg) == {"nan": 2, "inf": 1}
    check.drain()
    assert _counts(agg) == {"nan": 2, "inf": 1}  # nothing counted twice


def test_drain_checks_a_partial_group() -> None:
    agg = Aggregator((16,))
    check = ErrorCheck(agg)
    check.check(_decode_out(float("-inf"), torch.bfloat16))
    check.check(_decode_out(None, torch.float16))
    check.drain()
    assert _counts(agg) == {"nan": 0, "inf": 1}


def test_large_output_checked_at_once() -> None:
    agg = Aggregator((16,))
    check = ErrorCheck(agg)
    big = torch.zeros(SMALL_NUMEL + 1)
    big[-1] = float("nan")
    check.check(big)
    assert _counts(agg) == {"nan": 1, "inf": 0}


@pytest.mark.parametrize("out", [torch.zeros(0), torch.tensor([1, 2])])
def test_empty_and_integer_outputs_ignored(out: torch.Tensor) -> None:
    agg = Aggregator((16,))
    check = ErrorCheck(agg)
    check.check(out)
    check.drain()
    assert _counts(agg) == {"nan": 0, "inf": 0}
