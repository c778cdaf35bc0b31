"""Load against a running gateway with real documents: closed loop (a fixed number of requests in
flight) and open loop (Poisson arrivals at a rate in pages/s), one measured point each.

Every request is ``POST /v1/ocr`` of a whole document; its outcome keeps the status, the seconds it
took end to end, and from a 200's result each page's queue wait and engine time
(``timings.queue_s``, ``timings.engine_s``).
"""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ocrserve.bench.analysis import Point
from ocrserve.bench.harness import percentile

#: Seconds one request may take before the load generator gives up on it (counted as status 0).
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class LoadDocument:
    """A document the load sends: its name (unique in the load: its path relative to the folder it
    was found in), bytes and page count (learned from a first request)."""

    name: str
    data: bytes
    pages: int


@dataclass
class RequestOutcome:
    """One request: its document's name, HTTP status (0: no answer), seconds end to end, and for a
    200 the pages done, the text, and per page its queue wait and engine seconds; in an open loop,
    also when it was sent (seconds after the point began); and the completion tokens of each page
    whose engine reported them (vLLM's ``usage.completion_tokens``, in the page's ``generation``)."""

    document: str
    status: int
    seconds: float
    pages: int = 0
    text: str = ""
    queue_s: list[float] = field(default_factory=list)
    engine_s: list[float] = field(default_factory=list)
    sent_s: float = 0.0
    completion_tokens: list[int] = field(default_factory=list)


@dataclass
class Measurement:
    """The outcomes of one point of a sweep.

    Attributes:
        mode: ``closed`` (``value`` = requests in flight) or ``open`` (``value`` = pages/s offered).
        value: the point's concurrency or rate.
        seconds: how long the point ran (from its first request to its last answer).
        outcomes: every request's outcome.
        setting: the server-side settings this point ran under (``KEY=VALUE`` joined by spaces, the
            swept key first), or ``""``.
        offered: an open loop's pages/s as it came out: the pages of the requests it sent over its
            seconds of arrivals (a Poisson process's count is random: ``value`` is its mean); NaN
            for a closed loop.
    """

    mode: str
    value: float
    seconds: float
    outcomes: list[RequestOutcome]
    setting: str = ""
    offered: float = math.nan

    @property
    def pages_per_s(self) -> float:
        """Pages of successful requests per second."""
        return sum(o.pages for o in self.outcomes if o.status == 200) / self.seconds if self.seconds else 0.0

    def latency(self, q: float) -> float:
        """The ``q``-th percentile of successful requests' end-to-end seconds (NaN with none)."""
        return percentile([o.seconds for o in self.outcomes if o.status == 200], q)

    def page_timing(self, which: str, q: float) -> float:
        """The ``q``-th percentile of pages' ``queue_s`` or ``engine_s`` (NaN with none)."""
        return percentile([s for o in self.outcomes for s in getattr(o, which)], q)

    @property
    def texts(self) -> dict[str, str]:
        """Each document's text, from its first successful request at this point."""
        texts: dict[str, str] = {}
        for outcome in self.outcomes:
            if outcome.status == 200:
                texts.setdefault(outcome.document, outcome.text)
        return texts

    @property
    def statuses(self) -> dict[str, int]:
        """Requests by HTTP status (``"0"``: no answer)."""
        return {str(k): v for k, v in sorted(Counter(o.status for o in self.outcomes).items())}

    def point(self) -> Point:
        """This measurement as a point of its sweep (:mod:`ocrserve.bench.analysis`)."""
        return Point(self.value, self.pages_per_s, self.latency(95), self.setting)

    def summary(self) -> dict:
        """The figures of the report: throughput, latency percentiles, queue and engine time, statuses."""
        return {
            "setting": self.setting,
            "mode": self.mode,
            "value": self.value,
            "seconds": round(self.seconds, 3),
            "requests": len(self.outcomes),
            "pages_per_s": round(self.pages_per_s, 4),
            "p50_s": _round(self.latency(50)),
            "p95_s": _round(self.latency(95)),
            "p99_s": _round(self.latency(99)),
            "queue_p50_s": _round(self.page_timing("queue_s", 50)),
            "queue_p95_s": _round(self.page_timing("queue_s", 95)),
            "engine_p50_s": _round(self.page_timing("engine_s", 50)),
            "offered_pages_per_s": _round(self.offered),
            "statuses": self.statuses,
            "completion_tokens": [n for o in self.outcomes if o.status == 200 for n in o.completion_tokens],
        }


def _round(value: float) -> float | None:
    return None if math.isnan(value) else round(value, 4)


def load_documents(found: dict[Path, Path]) -> list[LoadDocument]:
    """The documents of :func:`ocrserve.client.collect_documents` (path -> unique name) with their
    bytes, pages unknown (0) until :func:`count_pages`."""
    return [LoadDocument(str(name), path.read_bytes(), 0) for path, name in found.items()]


async def send(client: httpx.AsyncClient, document: LoadDocument, **form: str) -> RequestOutcome:
    """``POST /v1/ocr`` of one document with the ``form`` fields (e.g. ``priority="bulk"``); never
    raises for the server's answer or its absence."""
    started = time.monotonic()
    try:
        response = await client.post("/v1/ocr", files={"file": (Path(document.name).name, document.data)}, data=form)
    except httpx.HTTPError:
        return RequestOutcome(document.name, 0, time.monotonic() - started)
    seconds = time.monotonic() - started
    if response.status_code != 200:
        return RequestOutcome(document.name, response.status_code, seconds)
    result = response.json()
    timings = [page.get("timings", {}) for page in result["pages"]]
    return RequestOutcome(
        document.name,
        200,
        seconds,
        len(result["pages"]),
        result["text"],
        [t.get("queue_s", 0.0) for t in timings],
        [t.get("engine_s", 0.0) for t in timings],
        completion_tokens=[
            int(g["completion_tokens"])
            for g in (page.get("generation") or {} for page in result["pages"])
            if isinstance(g.get("completion_tokens"), int)
        ],
    )


async def count_pages(client: httpx.AsyncClient, documents: list[LoadDocument]) -> list[LoadDocument]:
    """Each document with its page count, from one request each (which also warms the path).

    Raises:
        RuntimeError: a document the server does not answer with 200 (the sweep would measure errors).
    """
    counted = []
    for document in documents:
        outcome = await send(client, document)
        if outcome.status != 200:
            answer = outcome.status or "nothing"
            raise RuntimeError(f"{document.name}: the server answered {answer} to a warm-up request")
        counted.append(LoadDocument(document.name, document.data, outcome.pages))
    return counted


async def closed_loop(
    client: httpx.AsyncClient,
    documents: list[LoadDocument],
    concurrency: int,
    seconds: float,
    tick: Callable[[RequestOutcome], None] = lambda _: None,
) -> Measurement:
    """``concurrency`` workers, each sending the documents round robin one after another, starting
    requests for ``seconds``; requests in progress then are awaited and counted."""
    outcomes: list[RequestOutcome] = []
    started = time.monotonic()
    stop_at = started + seconds

    async def worker(offset: int) -> None:
        index = offset
        while time.monotonic() < stop_at:
            outcome = await send(client, documents[index % len(documents)])
            outcomes.append(outcome)
            tick(outcome)
            index += 1

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return Measurement("closed", concurrency, time.monotonic() - started, outcomes)


async def open_loop(
    client: httpx.AsyncClient,
    documents: list[LoadDocument],
    rate: float,
    seconds: float,
    seed: int = 0,
    tick: Callable[[RequestOutcome], None] = lambda _: None,
) -> Measurement:
    """Requests arrive as a Poisson process offering ``rate`` pages/s (``rate`` / mean pages a
    document requests a second) for ``seconds``, whatever the server's answers; every request is
    then awaited."""
    rng = random.Random(seed)
    requests_per_s = rate / statistics.fmean(d.pages for d in documents)
    outcomes: list[RequestOutcome] = []
    tasks: list[asyncio.Task] = []

    async def one(document: LoadDocument, sent_s: float) -> None:
        outcome = await send(client, document)
        outcome.sent_s = sent_s
        outcomes.append(outcome)
        tick(outcome)

    started = time.monotonic()
    due = started
    pages = 0
    while (due := due + rng.expovariate(requests_per_s)) < started + seconds:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        document = documents[len(tasks) % len(documents)]
        tasks.append(asyncio.create_task(one(document, time.monotonic() - started)))
        pages += document.pages
    await asyncio.gather(*tasks)
    return Measurement("open", rate, time.monotonic() - started, outcomes, offered=pages / seconds)


def http_client(url: str, concurrency: int, api_key: str | None = None) -> httpx.AsyncClient:
    """An HTTP client for the load: enough connections for ``concurrency`` requests at once."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=max(concurrency, 1), max_keepalive_connections=max(concurrency, 1))
    return httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=REQUEST_TIMEOUT_S, limits=limits)
