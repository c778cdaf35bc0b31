"""The mixed scenario: a stream of interactive pages over a flood of bulk documents, the lanes'
promise measured (``ocrserve bench --scenario mixed``).

Three phases against one gateway, each ``seconds`` long: the interactive stream alone (one
single-page request every ``interval`` seconds), the bulk flood alone (``clients`` workers posting
documents with ``priority=bulk`` one after another), then both at once. The figures: the stream's
p95 under the flood against its idle p95, and bulk pages/s with the stream against without
(issue 3's targets: at most 1.5x, at least 0.9x; issue 13's for the embedded engine: 1.2x).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx

from ocrserve.bench.harness import percentile
from ocrserve.bench.load import LoadDocument, RequestOutcome, send


async def stream(
    client: httpx.AsyncClient, page: LoadDocument, interval: float, until: float, tick: Callable
) -> list[RequestOutcome]:
    """One interactive request of ``page`` every ``interval`` seconds until the monotonic instant ``until``."""
    outcomes = []
    while time.monotonic() < until:
        outcome = await send(client, page, priority="interactive")
        outcomes.append(outcome)
        tick(outcome)
        await asyncio.sleep(max(0.0, interval - outcome.seconds))
    return outcomes


async def flood(
    client: httpx.AsyncClient, documents: list[LoadDocument], clients: int, until: float, tick: Callable
) -> list[RequestOutcome]:
    """``clients`` workers posting ``documents`` round robin with ``priority=bulk`` until ``until``."""
    outcomes: list[RequestOutcome] = []

    async def worker(offset: int) -> None:
        index = offset
        while time.monotonic() < until:
            outcome = await send(client, documents[index % len(documents)], priority="bulk")
            outcomes.append(outcome)
            tick(outcome)
            index += 1

    await asyncio.gather(*(worker(i) for i in range(clients)))
    return outcomes


def _pages_per_s(outcomes: list[RequestOutcome], seconds: float) -> float:
    return sum(o.pages for o in outcomes if o.status == 200) / seconds


def _p95(outcomes: list[RequestOutcome]) -> float:
    return percentile([o.seconds for o in outcomes if o.status == 200], 95)


async def mixed(
    client: httpx.AsyncClient,
    page: LoadDocument,
    documents: list[LoadDocument],
    clients: int,
    interval: float,
    seconds: float,
    tick: Callable = lambda _: None,
) -> dict:
    """The three phases (module docstring); their figures and the two ratios."""
    idle = await stream(client, page, interval, time.monotonic() + seconds, tick)
    started = time.monotonic()
    alone = await flood(client, documents, clients, started + seconds, tick)
    alone_s = time.monotonic() - started
    started = time.monotonic()
    loaded, both = await asyncio.gather(
        stream(client, page, interval, started + seconds, tick),
        flood(client, documents, clients, started + seconds, tick),
    )
    both_s = time.monotonic() - started
    figures = {
        "interactive_idle_n": len(idle),
        "interactive_idle_p95_s": _p95(idle),
        "interactive_loaded_n": len(loaded),
        "interactive_loaded_p95_s": _p95(loaded),
        "bulk_alone_pages_per_s": _pages_per_s(alone, alone_s),
        "bulk_with_stream_pages_per_s": _pages_per_s(both, both_s),
        "errors": sum(o.status != 200 for o in idle + alone + loaded + both),
    }
    figures["p95_ratio"] = figures["interactive_loaded_p95_s"] / figures["interactive_idle_p95_s"]
    figures["bulk_ratio"] = figures["bulk_with_stream_pages_per_s"] / figures["bulk_alone_pages_per_s"]
    return figures
