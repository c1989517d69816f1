"""Small helpers shared by the collector tests."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterable
from typing import Any

from kcops.agent.collectors.base import CollectorRunner
from kcops.agent.samples import Sample, SeriesKey
from kcops.agent.signals import register_all
from kcops.agent.store import Store


def collect(c: Any, now: float = 1000.0) -> list[Sample]:
    res = c.collect(now)
    if inspect.isawaitable(res):
        res = asyncio.run(_await(res))
    return list(res)


async def _await(res: Any) -> Any:
    return await res


def by_key(samples: Iterable[Sample]) -> dict[SeriesKey, float]:
    return {s.key: s.value for s in samples}


def value(samples: Iterable[Sample], name: str, **labels: str) -> float | None:
    want = SeriesKey.of(name, labels)
    for s in samples:
        if s.key == want:
            return s.value
    return None


def names(samples: Iterable[Sample]) -> set[str]:
    return {s.name for s in samples}


def runner(*collectors: Any) -> tuple[CollectorRunner, Store]:
    store = Store()
    register_all(store)
    return CollectorRunner(store, list(collectors)), store


def latest(store: Store, name: str, **labels: str) -> float | None:
    got = store.latest(SeriesKey.of(name, labels))
    return None if got is None else got[1]


def need(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """Like :func:`value`, but the series must be there."""
    got = value(samples, name, **labels)
    assert got is not None, f"{name}{labels} missing"
    return got
