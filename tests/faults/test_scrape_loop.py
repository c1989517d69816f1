"""A scrape of /metrics does not stall the agent's loop, whatever the store holds.

What is asserted is where the work runs, not how long it takes on a busy box: the page is
built and encoded on a thread other than the loop's, the loop runs other coroutines while
the snapshot is read, and scrapes that arrive together share one build.
"""

from __future__ import annotations

import asyncio
import threading

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kcops.agent.exporter import Snapshot, StoreExporter
from kcops.agent.samples import SeriesKey
from kcops.agent.store import Store

SERIES = 20_000


class Watched(StoreExporter):
    """The exporter, noting which thread builds each page and how many builds ran."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, lambda: 1000.0, stale_after_s=30.0)
        self.threads: list[int] = []

    def families(self, snapshot: Snapshot) -> list[Metric]:
        self.threads.append(threading.get_ident())
        return super().families(snapshot)


def full_store() -> Store:
    store = Store(max_series=SERIES + 10, max_series_per_source=SERIES + 10)
    for i in range(SERIES):
        labels = {"layer": str(i // 20), "le": str(i % 20)}
        store.append(SeriesKey.of("kcops_kc_tokens_bucket", labels), 999.0, float(i))
    return store


def test_the_page_is_built_off_the_loop_while_the_loop_keeps_running() -> None:
    exporter = Watched(full_store())

    async def scenario() -> tuple[int, bytes, int]:
        loop_thread = threading.get_ident()
        turns = 0
        done = asyncio.Event()

        async def other_work() -> None:
            nonlocal turns
            while not done.is_set():
                turns += 1
                await asyncio.sleep(0)

        worker = asyncio.create_task(other_work())
        body, _ = await exporter.scrape(None)
        done.set()
        await worker
        return turns, body, loop_thread

    turns, body, loop_thread = asyncio.run(scenario())
    assert exporter.threads and loop_thread not in exporter.threads
    # The snapshot yields every few thousand series: other coroutines ran in between,
    # not only after the whole page (a loop-bound build gives 1 turn).
    assert turns >= SERIES // 2_000
    samples = [s for f in text_string_to_metric_families(body.decode()) for s in f.samples]
    assert len(samples) == SERIES


def test_scrapes_arriving_together_share_one_build() -> None:
    exporter = Watched(full_store())

    async def scenario() -> list[tuple[bytes, str]]:
        return await asyncio.gather(*(exporter.scrape(None) for _ in range(8)))

    pages = asyncio.run(scenario())
    assert len(exporter.threads) == 1
    assert len({body for body, _ in pages}) == 1
    # Another content type is another page, built on its own.
    asyncio.run(exporter.scrape("application/openmetrics-text"))
    assert len(exporter.threads) == 2
