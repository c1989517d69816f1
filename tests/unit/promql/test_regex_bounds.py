"""Compiled regexes are bounded: the cache by bytes, a query's program by size and deadline.

Issue 24: distinct large regexes sent to the query API stayed compiled in a
cache of 1024 entries, RSS 73 -> 523 MB after about 130 queries.
"""

from __future__ import annotations

import ctypes
import time

import pytest
import re2

from kcops.agent.promql import regex
from kcops.agent.promql.budget import QueryTimeout
from kcops.agent.promql.model import RuleError
from kcops.agent.promql.regexcache import RegexCache, estimate_bytes


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * 4096


def test_distinct_large_regexes_stay_within_the_cache_bound_by_bytes() -> None:
    cache = regex.CACHE
    # 300 distinct programs of 8,000 instructions (about 0.6 MB each measured, compiled
    # and matched): the old count-bounded cache kept them all, some 200 MB.
    before = rss_bytes()
    for i in range(300):
        rx = regex.compile_anchored(rf"(?i)\w{{1000}}|k{i}")
        assert regex.full_match(rx, "A" * 1000) and regex.full_match(rx, f"k{i}")
        assert cache.bytes <= cache.max_bytes
    grown = rss_bytes() - before
    print(
        f"300 regexes: cache {cache.bytes / 2**20:.1f} MiB in {len(cache)} entries, "
        f"RSS +{grown / 2**20:.1f} MiB"
    )
    assert cache.evictions > 0
    assert grown <= 64 * 2**20, grown


def test_the_cache_keeps_the_recently_used_and_charges_each_entry() -> None:
    cache = RegexCache(max_bytes=100)
    cache.put(("a", 1), "A", 40)
    cache.put(("b", 1), "B", 40)
    assert cache.get(("a", 1)) == "A"  # now the most recently used
    cache.put(("c", 1), "C", 40)  # evicts b, the least recently used
    assert (cache.get(("a", 1)), cache.get(("b", 1)), cache.get(("c", 1))) == ("A", None, "C")
    assert (cache.bytes, len(cache), cache.evictions) == (80, 2, 1)
    cache.put(("huge", 1), "H", 101)  # larger than the whole bound: not kept
    assert cache.get(("huge", 1)) is None and cache.bytes == 80


_MALLINFO2 = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in _MALLINFO2.split()]


def _malloc_used() -> int:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        pytest.skip("no glibc mallinfo2 here")
    info = libc.mallinfo2()
    return int(info.uordblks + info.hblkhd)


@pytest.mark.parametrize(
    "pattern",
    [r"\pL{100}", r".{1000}", r"(?i)\w{1000}", r"[a-z]{1000}", r"(a|b|c|d){500}", "foo|bar"],
)
def test_the_estimate_is_above_what_compiling_and_matching_allocate(pattern: str) -> None:
    # tracemalloc does not see RE2's C++ allocations; glibc's counters do. Twenty
    # distinct programs are kept, so what one costs is their average.
    inputs = [c * n for c in "aé_1." for n in (0, 1, 7, 100, 999, 1000, 1001)]
    inputs += [f"{i}-{'x' * (i % 50)}" for i in range(300)]
    opts = re2.Options()
    opts.log_errors = False
    kept = []
    u0 = _malloc_used()
    for i in range(20):
        rx = re2.compile(f"^(?:{pattern}|k{i})$", opts)
        for s in inputs:
            rx.search(s)
        kept.append(rx)
    used = (_malloc_used() - u0) / len(kept)
    est = estimate_bytes(pattern, kept[0], regex.RULE_MAX_MEM)
    re2.purge()
    print(f"{pattern}: {kept[0].programsize} instructions, {used:.0f} bytes, {est} estimated")
    assert used <= est


def test_a_query_gets_a_smaller_program_bound_than_a_rule() -> None:
    pattern = r"\pL{200}"  # about 240,000 instructions: within 8 MiB, past 2 MiB
    assert regex.compile_anchored(pattern).programsize > 0
    with (
        regex.query_bounds(time.perf_counter() + 60),
        pytest.raises(RuleError, match="query API's 2 MiB program limit"),
    ):
        regex.compile_anchored(pattern)


def test_a_query_compiles_no_new_regex_past_its_deadline() -> None:
    cached = regex.compile_anchored("kept|cached")
    with regex.query_bounds(time.perf_counter() + 60):
        again = regex.compile_anchored("kept|cached")  # compiled for a query, now cached
    with regex.query_bounds(time.perf_counter() - 1):
        assert regex.compile_anchored("kept|cached") is again
        with pytest.raises(QueryTimeout, match="compiling its regexes"):
            regex.compile_anchored("never|compiled|before")
    assert regex.compile_anchored("kept|cached") is cached  # a rule's: no deadline


def test_one_pattern_longer_than_the_bound_is_refused_naming_the_bound() -> None:
    with pytest.raises(RuleError, match=f"at most {regex.MAX_REGEX_CHARS} in one regex"):
        regex.compile_anchored("a" * (regex.MAX_REGEX_CHARS + 1))
