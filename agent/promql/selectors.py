"""Vector and range selectors over the agent's store, with Prometheus 2.x semantics.

Matches promtool 2.42 (the installed reference): an instant selector takes the
newest sample in the closed window ``[t - lookback, t]`` unless it is a
staleness marker; a range selector takes the samples in the closed window
``[t - range, t]`` and drops staleness markers. (Prometheus 3 made both
windows left-open.)
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable

import promql_parser as pp

from kcops.agent.promql.literals import regex_of
from kcops.agent.promql.model import NAME, Elem, Labels, Vector
from kcops.agent.promql.regex import compile_anchored, full_match
from kcops.agent.samples import SeriesKey, is_stale
from kcops.agent.store import Store

Matcher = Callable[[str], bool]
LOOKBACK_S = 300.0


def _compile(m: pp.Matcher) -> tuple[str, Matcher]:
    op = m.op
    value = m.value
    if op == pp.MatchOp.Equal:
        return m.name, lambda v: v == value
    if op == pp.MatchOp.NotEqual:
        return m.name, lambda v: v != value
    # RE2, anchored as Prometheus anchors it (see regex.py for why not ``re``).
    rx = compile_anchored(regex_of(value))
    if op == pp.MatchOp.Re:
        return m.name, lambda v: full_match(rx, v)
    return m.name, lambda v: not full_match(rx, v)


def _free(units: int) -> None:
    return None


class CompiledSelector:
    """A vector selector's matchers, compiled once at load."""

    def __init__(self, vs: pp.VectorSelector) -> None:
        self.name: str | None = vs.name
        self.matchers = [_compile(m) for m in vs.matchers.matchers]
        off = vs.offset
        self.offset_s = off.total_seconds() if off is not None else 0.0
        self.equal_labels = {
            m.name: m.value
            for m in vs.matchers.matchers
            if m.op == pp.MatchOp.Equal and m.name != NAME
        }
        if self.name is None:
            for m in vs.matchers.matchers:
                if m.name == NAME and m.op == pp.MatchOp.Equal:
                    self.name = m.value


class SeriesSource:
    """Reads matching series from a :class:`Store`; caches full label sets per key."""

    def __init__(self, store: Store, lookback_s: float = LOOKBACK_S, item_units: int = 1) -> None:
        self.store = store
        self.lookback_s = lookback_s
        self._labels: dict[SeriesKey, Labels] = {}
        # Told the work done (``item_units`` per key scanned and per newest
        # sample looked up, 1 per sample of a range read): the evaluator's budget.
        self.charge: Callable[[int], None] = _free
        self.item_units = item_units

    def full_labels(self, key: SeriesKey) -> Labels:
        lab = self._labels.get(key)
        if lab is None:
            if len(self._labels) > 2 * len(self.store) + 1000:
                # Series come and go; forget keys the store may have evicted.
                self._labels.clear()
            lab = tuple(sorted((*key.labels, (NAME, key.name))))
            self._labels[key] = lab
        return lab

    def matching(self, sel: CompiledSelector) -> list[SeriesKey]:
        keys = self.store.keys(sel.name) if sel.name is not None else self.store.keys()
        out = []
        scanned = 0
        for key in keys:
            scanned += 1
            d = key.labels
            ok = True
            for label, fn in sel.matchers:
                if label == NAME:
                    v = key.name
                else:
                    v = ""
                    for k, val in d:
                        if k == label:
                            v = val
                            break
                if not fn(v):
                    ok = False
                    break
            if ok:
                out.append(key)
        self.charge(scanned * self.item_units)
        out.sort(key=self.full_labels)
        return out

    def instant(self, sel: CompiledSelector, t: float) -> Vector:
        return [e for e, _ in self.instant_stamped(sel, t)]

    def instant_stamped(self, sel: CompiledSelector, t: float) -> list[tuple[Elem, float]]:
        """Like :meth:`instant`, each element with its sample's timestamp (for ``timestamp()``)."""
        ref = t - sel.offset_s
        out: list[tuple[Elem, float]] = []
        keys = self.matching(sel)
        self.charge(len(keys) * self.item_units)  # a lookup of the newest sample each
        for key in keys:
            got = self.store.latest(key, at=ref)
            if got is None:
                continue
            ts, v = got
            if ts < ref - self.lookback_s:
                continue
            out.append((Elem(self.full_labels(key), v), ts))
        return out

    def range(
        self, sel: CompiledSelector, t: float, range_s: float
    ) -> list[tuple[Labels, array, array]]:
        """Per matching series: (labels, timestamps, values), markers dropped, empty skipped."""
        end = t - sel.offset_s
        out = []
        for key in self.matching(sel):
            ts, vs = self.store.range_arrays(key, end - range_s, end)
            self.charge(len(ts))
            if not ts:
                continue
            if any(math.isnan(v) for v in vs):
                keep = [i for i, v in enumerate(vs) if not is_stale(v)]
                if len(keep) != len(vs):
                    ts = array("d", (ts[i] for i in keep))
                    vs = array("d", (vs[i] for i in keep))
                if not ts:
                    continue
            out.append((self.full_labels(key), ts, vs))
        return out
