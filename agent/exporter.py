"""Prometheus exposition of what the store holds.

The app owns one :class:`StoreExporter` (a prometheus-client collector); nothing registers
into the global registry. Each series is exposed with its newest value, unless that value is older
than ``stale_after_s`` or is a staleness marker: absent stays absent.

One label that UTF-8 cannot encode (a lone surrogate, from any input that let one
through) must not cost the whole page: prometheus-client encodes the page in one
piece, so :func:`render` renders again with such text escaped (:func:`safe_text`).

A scrape must not stall the agent's loop (about a second of CPU at 50k series): the
loop only reads each series' newest value, a few thousand at a time between yields, and
a thread builds and encodes the page from that snapshot (:meth:`StoreExporter.scrape`).
Scrapes that arrive while one is rendering share its page.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Protocol

from prometheus_client.metrics_core import Metric

from kcops.agent.clock import Clock
from kcops.agent.samples import LabelPairs, SeriesKey
from kcops.agent.store import Store
from kcops.exposition import negotiate

_HIST_SUFFIXES = ("_bucket", "_sum", "_count")
_YIELD_EVERY = 2_000  # series read between two yields to the loop
Snapshot = list[tuple[SeriesKey, float]]


def family_of(store: Store, name: str) -> tuple[str, str, str]:
    """(family name, type, help) for a series name."""
    meta = store.meta(name)
    if meta is not None:
        if meta.type == "counter" and name.endswith("_total"):
            return name[: -len("_total")], "counter", meta.help
        return name, meta.type, meta.help
    for suffix in _HIST_SUFFIXES:
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            bmeta = store.meta(base)
            if bmeta is not None and bmeta.type == "histogram":
                return base, "histogram", bmeta.help
    return name, "untyped", ""


class StoreExporter:
    """A prometheus-client custom collector reading the store at scrape time."""

    def __init__(self, store: Store, clock: Clock, stale_after_s: float = 30.0) -> None:
        self.store = store
        self.clock = clock
        self.stale_after_s = stale_after_s
        self._building: dict[str, asyncio.Future[tuple[bytes, str]]] = {}

    def describe(self) -> list[Metric]:
        # Custom collector: describing would run collect() at registration.
        return []

    def collect(self) -> Iterator[Metric]:
        now, keys = self.clock(), self.store.keys()
        yield from self.families([kv for key in keys if (kv := self._read(key, now))])

    def _read(self, key: SeriesKey, now: float) -> tuple[SeriesKey, float] | None:
        latest = self.store.latest(key, at=now, lookback_s=self.stale_after_s)
        return None if latest is None else (key, latest[1])

    def families(self, snapshot: Snapshot) -> list[Metric]:
        """The exposition's families from (series, newest value) pairs; reads only the
        store's metadata, so a thread may call it while the loop writes samples."""
        families: dict[str, Metric] = {}
        held: dict[str, list[tuple[SeriesKey, float]]] = {}
        for key, value in snapshot:
            fam_name, typ, help_ = family_of(self.store, key.name)
            if fam_name not in families:
                families[fam_name] = Metric(fam_name, help_ or fam_name, typ)
                held[fam_name] = []
            held[fam_name].append((key, value))
        for fam_name, fam in families.items():
            for key, value in sorted(held[fam_name], key=lambda kv: sample_order(fam_name, kv[0])):
                fam.add_sample(key.name, key.label_dict(), value)
        return [families[name] for name in sorted(families)]

    async def scrape(self, accept: str | None) -> tuple[bytes, str]:
        """The page for ``accept``, built off the loop; one build per content type at a time,
        shared by the scrapes that arrive while it runs."""
        _, content_type = negotiate(accept)
        task = self._building.get(content_type)
        if task is None:
            task = asyncio.ensure_future(self._build(accept))
            self._building[content_type] = task
            task.add_done_callback(lambda _: self._building.pop(content_type, None))
        return await asyncio.shield(task)

    async def _build(self, accept: str | None) -> tuple[bytes, str]:
        snapshot: Snapshot = []
        now = self.clock()
        for i, key in enumerate(self.store.keys()):
            if (kv := self._read(key, now)) is not None:
                snapshot.append(kv)
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        metrics = await asyncio.to_thread(self.families, snapshot)
        return await asyncio.to_thread(render, _Fixed(metrics), accept)


class _Fixed:
    """Metrics already built, in the shape :func:`render` encodes."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


_SUFFIX_RANK = {"_bucket": 0, "_count": 1, "_sum": 2}
_ORDER_LABELS = ("le", "quantile")


def sample_order(family: str, key: SeriesKey) -> tuple[LabelPairs, int, float, str]:
    """Where a sample goes in its family's exposition.

    OpenMetrics wants each label set's samples together, and a histogram's buckets
    in numeric ``le`` order with ``+Inf`` last (a summary's quantiles likewise);
    the strings' order puts ``le="+Inf"`` first and ``le="10"`` before ``le="2"``."""
    group = tuple(p for p in key.labels if p[0] not in _ORDER_LABELS)
    rank = _SUFFIX_RANK.get(key.name[len(family) :], 0)
    bound = next((v for k, v in key.labels if k in _ORDER_LABELS), "")
    return group, rank, _number(bound), key.name


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.inf


def safe_text(text: str) -> str:
    """``text`` if UTF-8 can encode it, else with each unencodable character (a lone
    surrogate) written as its ``\\udXXX`` escape: visible, and encodable."""
    if text.isascii():
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


class _Collects(Protocol):
    def collect(self) -> Iterator[Metric]: ...


class _Escaped:
    """A registry's metrics with every name, label and help text passed through
    :func:`safe_text`: what :func:`render` falls back to."""

    def __init__(self, registry: _Collects) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for m in self.registry.collect():
            m.documentation = safe_text(m.documentation)
            m.samples = [
                s._replace(
                    name=safe_text(s.name),
                    labels={safe_text(k): safe_text(v) for k, v in s.labels.items()},
                )
                for s in m.samples
            ]
            yield m


def render(registry: _Collects, accept: str | None) -> tuple[bytes, str]:
    """Exposition bytes and content type, negotiated from the Accept header.

    The page is encoded whole, so one unencodable label would fail it: then it is
    rendered again with such text escaped (the cost of that scrape only)."""
    encoder, content_type = negotiate(accept)
    try:
        return encoder(registry), content_type  # type: ignore[arg-type]
    except UnicodeEncodeError:
        return encoder(_Escaped(registry)), content_type  # type: ignore[arg-type]
