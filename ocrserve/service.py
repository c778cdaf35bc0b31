"""Documents in, results out: inspect, pick a lane, decode pages, route them, assemble the result.

The result dict is the one DESIGN.md fixes (``id``, ``model``, ``lane``, ``text``, ``pages``,
``usage``). A page that fails carries an ``error`` problem object and empty text; its neighbours
are unaffected. A document whose every page failed raises the first page's problem; one whose
deadline passed (``timeout``, or the lane's default) raises 504.

With a dedup cache (``ocrserve.store.cache``), a document seen before with the same pages and model
is answered from the cache without engine work, and a document whose every page succeeded is
cached.

Before admission, a request's first pages are previewed and their line units counted
(:mod:`ocrserve.preprocess.lines`): a document's (a request whose pages run as background work)
one at a time per lane, in the order they came, so that once it is its turn, the requests
admitted meanwhile may leave it no room, and it is refused then without its previews
(:meth:`~ocrserve.router.Router.check_held`); single pages at once, without a time limit
(sixteen at once beside vLLM's CPU backend, counted in turn or within 10 s, left the last
refused). Counted all at once, a fresh gateway beside a CPU hog spent the first seconds of a
burst of twelve 2-page documents on the previews of all twelve, while the engine's pages (which
yield the cores) waited. A document whose turn and count have not ended within ``router.admission_timeout_s`` of
its arrival is refused (503 ``admission-timeout``, ``Retry-After``): a background request's count
yields the cores to interactive pages, and beside a stream of them a flood's documents waited up
to 33 s to be refused. One that the turns ahead of it and its own would keep past that limit
(:class:`~ocrserve.preview_turn.PreviewTurn`) is refused on arrival: at the limit alone, every
refusal of a flood of 5-page receipts beside a single page every 0.5 s came after 10.3 s.

A document's counted line units are kept (:data:`COUNTS_KEPT` documents, by content and pages), and
a later post of the same content and pages, by any client, is priced on them at once, without
previews or a turn; one that was waiting for the turn while they were counted takes them when its
turn comes, and its pages are not priced again in the turns ahead of others, nor the turn it took
in milliseconds timed (:class:`~ocrserve.preview_turn.PreviewTurn`). Priced as previews of their
own, five of twelve clients posting one 2-page receipt at once were refused on arrival (held-out
seed 51, 2 cores; none after); timed, the kept turns could price those ahead of the next burst at
nothing. Previewed again, the retries of eleven refused clients, every few seconds, took the cores
from the engine's pages beside a CPU hog; and a burst of twelve clients posting one document was
counted twelve times, one turn after another, while the engine's pages waited. What is shared is a
price, never a result: each post's pages still run for it (the dedup cache alone answers a document
from another post's result, and only where it is on).

A request refused at its deadline only for admission's margin for what its cost model has not
seen, while no other request is admitted or on its way to admission and no page is in the engine
(:meth:`~ocrserve.router.Router.probe_wanted`), has its first page run as a probe
(:meth:`OcrService.probe`), one at a time: decoded, then run once the engine is still vacant, at
the lowest priority and without a deadline, so that the page's seconds teach the model; the
page's result is kept for that client's retry of the same content, which is then priced and run
without it. Otherwise a fresh gateway sent only documents that the margin refuses never learns,
and refuses them to the end on an idle engine. The refusal does not wait for the probe; it says
when the page should be read (``Retry-After``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import logging
import math
import os
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import BinaryIO

from cachetools import LRUCache

from ocrserve import metrics
from ocrserve.alarm import within
from ocrserve.config import Config
from ocrserve.errors import DeadlinePassed, Overloaded, ProblemError
from ocrserve.formats import assemble_result
from ocrserve.pipeline import Attempt, PagePipeline
from ocrserve.preprocess import PREVIEW_PAGES, DocumentInfo, Preprocessor, Source
from ocrserve.preview_turn import PreviewTurn
from ocrserve.router import Reservation, Router
from ocrserve.scheduling import BULK, Terms, choose_lane, inspection_class, resolve
from ocrserve.servicetime import Work
from ocrserve.store.cache import DedupCache
from ocrserve.work import Deadline, EngineClass, Priority, WorkItem

log = logging.getLogger(__name__)

#: Documents whose counted line units are kept for later posts of the same content and pages
#: (module docstring); each holds a float or None for each previewed page.
COUNTS_KEPT = 1024
#: Pages a probe read (module docstring) kept for their clients' retries.
PROBED_KEPT = 64
#: How long a probe's decoded page waits for the router to be vacant before it is dropped (the
#: pages in the engine meanwhile teach the cost model), and how often it looks, seconds.
PROBE_WAIT_S, PROBE_POLL_S = 30.0, 0.1
#: Where a probe's page goes in the bulk lane's queue (lower first): after every request's, a
#: job's least urgent included (``router.bulk.priority + jobs.max_priority``, at most 10 + 99).
PROBE_ORDER = Priority(1 << 20)
#: Uploads above this many bytes are kept in a temporary file rather than in memory: a synchronous
#: one reaches the decoding processes as a path, not as bytes pickled once per chunk of pages, and a
#: raw body is spooled to disk as it arrives (``ocrserve.api.uploads``).
SPOOL_BYTES = 1 << 20
#: Bytes copied at a time when a large upload is written to its temporary file.
COPY_CHUNK = 1 << 20


@contextlib.asynccontextmanager
async def staged(document: bytes | BinaryIO) -> AsyncIterator[tuple[Source, str]]:
    """The document as the decoding processes take it, and its sha256: its bytes when at most
    :data:`SPOOL_BYTES`, else a temporary file (removed on exit) written :data:`COPY_CHUNK` at a
    time off the event loop, so a large upload is never held in memory whole."""
    with contextlib.ExitStack() as stack:
        yield await asyncio.to_thread(_stage, document, stack)


def _stage(document: bytes | BinaryIO, stack: contextlib.ExitStack) -> tuple[Source, str]:
    reader = io.BytesIO(document) if isinstance(document, bytes) else document
    digest = hashlib.sha256(head := reader.read(SPOOL_BYTES + 1))
    if len(head) <= SPOOL_BYTES:
        return head, digest.hexdigest()
    fh = stack.enter_context(tempfile.NamedTemporaryFile(prefix="ocrserve-upload-"))  # noqa: SIM115 (in the stack)
    fh.write(head)
    while chunk := reader.read(COPY_CHUNK):
        digest.update(chunk)
        fh.write(chunk)
    fh.flush()
    return Path(fh.name), digest.hexdigest()


class OcrService:
    """Runs whole documents through preprocessor, router and engine.

    Args:
        config: the profile.
        preprocessor: decodes and normalizes pages.
        router: admits pages to lanes and dispatches them to the engine.
        cache: the dedup cache, or None for none.
    """

    def __init__(self, config: Config, preprocessor: Preprocessor, router: Router, cache: DedupCache | None = None):
        self.config = config
        self.preprocessor = preprocessor
        self.router = router
        self.pipeline = PagePipeline(router, preprocessor)
        self.cache = cache
        # one document's previews at a time per lane, in the order they came (module docstring)
        self._turns: defaultdict[str, PreviewTurn] = defaultdict(PreviewTurn)
        # line units counted for documents, by (content, pages) (module docstring)
        self._counted: LRUCache[tuple[str, str | None], list[float | None]] = LRUCache(COUNTS_KEPT)
        self._probe: asyncio.Task | None = None  # a refused request's page teaching the cost model
        # what probes read, by (client, content, page index), for their clients' retries
        self._probed: LRUCache[tuple[str, str, int], Attempt] = LRUCache(PROBED_KEPT)

    async def ocr(
        self, document: bytes | BinaryIO, *, pages: str | None = None, work: WorkItem = WorkItem()
    ) -> tuple[dict, bool]:
        """OCR a document synchronously.

        Args:
            document: the uploaded file: its bytes, or a binary file positioned at its start.
            pages: 1-based page ranges (``"1-3,5"``); all pages when omitted.
            work: the request's lane, priority and deadline (see :mod:`ocrserve.work`).

        Returns:
            ``(result, cached)``: the result dict (see module docstring), and whether it came from
            the dedup cache.

        Raises:
            ProblemError: 413/415 from the preprocessor, 400 for bad ``pages``, 503/429 when the lane is
                full, 504 when the deadline passed for any page, or every page's failure.
        """
        started = time.perf_counter()
        async with staged(document) as (source, sha256):
            # the lane is not known before inspection: a request that named none is inspected as urgent
            info = await self.preprocessor.inspect(source, inspection_class(work))
            indices = info.select(pages, self.config.preprocess)
            pixels = info.normalized_pixels(indices, self.config.preprocess)
            lane = choose_lane(work, self.config.router, len(indices), pixels)
            key = self.cache.key(sha256, indices) if self.cache else ""
            cached = await self.cache.get(key) if key else None
            if cached is not None:
                return assemble_result(cached, self.router.engine.model, lane, time.perf_counter() - started), True
            # the lane's default deadline runs from admission
            terms = resolve(work, self.config.router, len(indices), pixels)
            attempts = await self._attempts(source, sha256, info, indices, pages, terms)
        for attempt in attempts:
            self.pipeline.count_final(attempt)
        problems = [a.problem for a in attempts if a.problem]
        late = next((p for p in problems if isinstance(p, DeadlinePassed)), None)
        if late or len(problems) == len(attempts):
            raise late or problems[0]
        pages_out = [a.result.to_dict() for a in attempts]
        if key and not problems:
            await self.cache.put(key, pages_out)
        seconds = time.perf_counter() - started
        metrics.REQUEST_LATENCY_SECONDS.labels(lane).observe(seconds)
        return assemble_result(pages_out, self.router.engine.model, lane, seconds), False

    async def _attempts(
        self, source: Source, sha256: str, info: DocumentInfo, indices: list[int], pages: str | None, terms: Terms
    ) -> list[Attempt]:
        """Every selected page's attempt, in order (``indices``, as the client's ``pages`` selected
        them): the pages a probe ran for this client's refused try of the same content (module
        docstring) as the probe left them, the others priced on their line units, admitted and run.
        Where only admission's margin for the unseen refused it, its first page not yet run is
        probed (:meth:`probe`).

        Raises:
            PayloadTooLarge, Overloaded: as :meth:`~ocrserve.router.Router.admit`.
        """
        probed = {i: attempt for i in indices if (attempt := self._probed.get((terms.client, sha256, i)))}
        todo = [i for i in indices if i not in probed]
        attempts: list[Attempt] = []
        if todo:
            sizes = info.normalized_sizes(todo, self.config.preprocess)
            priced = self.router.request_work(sizes, len(todo), [0.0] * len(todo))  # the least they can be
            counted = (sha256, pages)
            units: dict[int, float | None] = {}
            async with contextlib.AsyncExitStack() as admitted:
                try:
                    units, arrival = await self._units(counted, source, info, indices, terms, priced)
                    priced = self.router.request_work(sizes, len(todo), [units.get(i) for i in todo])
                    tokens = info.visual_tokens(todo, self.config.preprocess)
                    admission = self.router.admit(terms, len(todo), tokens, priced, arrival)
                    reservation = await admitted.enter_async_context(admission)
                except Overloaded as refused:
                    if refused.slug != "deadline-unmeetable" or not self.router.probe_wanted(terms, priced):
                        raise
                    page = todo[0]
                    work, key = self.router.request_work(sizes[:1], 1, [units.get(page)]), (terms.client, sha256, page)
                    if not await self.probe(source, info, key, work, units.get(page), terms.lane):
                        raise
                    raise _probing(terms.lane, len(todo), page, self.router.alone_s(work)) from None
                attempts = await self._run_pages(source, info, todo, reservation, terms, units)
        for index in probed:
            self._probed.pop((terms.client, sha256, index), None)
        return sorted([*attempts, *probed.values()], key=lambda attempt: attempt.result.index)

    def _kept(self, key: tuple[str, str | None]) -> list[float | None] | None:
        """The line units kept for ``key``, a document's content and pages (counted in
        ``ocrserve_line_counts_total{how="kept"}``), or None."""
        if (units := self._counted.get(key)) is not None:
            metrics.LINE_COUNTS.labels("kept").inc()
        return units

    async def _units(
        self,
        key: tuple[str, str | None],
        source: Source,
        info: DocumentInfo,
        indices: list[int],
        terms: Terms,
        least: Work,
    ) -> tuple[dict[int, float | None], int | None]:
        """The line units of a request's first pages (of ``indices``, by page index), and its
        arrival number for :meth:`~ocrserve.router.Router.admit`: kept from an earlier post of the
        same content and pages (``key``; arrival None: it comes now), else counted on their
        previews in its turn while the pages it will run are held at their ``least`` work
        (:meth:`~ocrserve.router.Router.held`, :meth:`_line_units`; None for a page without a
        preview), and kept, unless another post of them was counted while it waited.

        Raises:
            PayloadTooLarge, Overloaded: as :meth:`~ocrserve.router.Router.held` and :meth:`_line_units`.
        """
        if (units := self._kept(key)) is not None:
            return dict(zip(indices, units, strict=False)), None

        async def count() -> list[float | None]:
            previews = await self.preprocessor.previews(source, info, indices, terms.engine_class)
            units = self._counted[key] = await self.pipeline.line_units(previews, terms.engine_class)
            metrics.LINE_COUNTS.labels("counted").inc()
            return units

        async with self.router.held(terms, round(least.pages), least) as arrival:
            units = await self._line_units(key, count, indices, terms, least, arrival)
        return dict(zip(indices, units, strict=False)), arrival

    async def probe(
        self,
        source: Source,
        info: DocumentInfo,
        key: tuple[str, str, int],
        work: Work,
        units: float | None,
        lane: str,
    ) -> bool:
        """Start running a page of a refused request through the engine as a probe of admission's
        cost model, unless a probe is running (module docstring): ``key``, its client, its
        content's sha256 and the page's index; ``work``, the page's; ``units``, its line units
        counted on its preview (None: not counted); ``lane``, the request's. Returns whether it
        started, once the probe has its own copy of ``source`` (a spooled upload's file is removed
        when its request ends); the page runs in the bulk lane after every other request
        (:data:`PROBE_ORDER`), without a deadline, and its result, where it succeeded, is kept for
        that client's retry (:data:`PROBED_KEPT`)."""
        if self._probe is not None and not self._probe.done():
            return False
        own = await asyncio.to_thread(_copied, source) if isinstance(source, Path) else source
        metrics.ADMISSION_PROBES.labels(lane).inc()
        log.info("probing admission's cost model with page %d of a %s request it refused", key[2] + 1, lane)
        self._probe = asyncio.create_task(self._run_probe(own, info, key, work, units), name="ocrserve-probe")
        return True

    async def _run_probe(
        self, source: Source, info: DocumentInfo, key: tuple[str, str, int], work: Work, units: float | None
    ) -> None:
        """The probe (:meth:`probe`): its page decoded, then run once the router is vacant
        (:meth:`_until_vacant`), so that it never shares the engine with a request admitted before
        it, which was priced without it."""
        terms = Terms(BULK, PROBE_ORDER, EngineClass.BACKGROUND)
        try:
            chunks = self.preprocessor.pages(source, info, [key[2]], EngineClass.BACKGROUND)
            async with contextlib.aclosing(chunks):
                (page,) = [page async for chunk in chunks for page in chunk]
            if not await self._until_vacant():
                log.info("probe of admission's cost model dropped: the engine was busy, and its pages teach the model")
                return
            async with self.router.admit(terms, 1, work=work) as reservation:
                if (attempt := await self.pipeline.run(page, reservation, terms, units)).problem is None:
                    self._probed[key] = attempt
        except ProblemError as problem:  # the bulk lane full now: no probe, nobody waits on it
            log.info("probe of admission's cost model not run: %s", problem)
        finally:
            if isinstance(source, Path):
                source.unlink(missing_ok=True)

    async def _until_vacant(self) -> bool:
        """Wait up to :data:`PROBE_WAIT_S` for the router to be vacant (no request admitted or on
        its way to admission, no page in the engine: :attr:`~ocrserve.router.Router.vacant`), looking every
        :data:`PROBE_POLL_S`; whether it is."""
        deadline = time.monotonic() + PROBE_WAIT_S
        while not self.router.vacant:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(PROBE_POLL_S)
        return True

    async def close(self) -> None:
        """Cancel a probe still running (:meth:`probe`)."""
        if self._probe is not None:
            self._probe.cancel()
            await asyncio.gather(self._probe, return_exceptions=True)

    async def _line_units(
        self,
        key: tuple[str, str | None],
        count: Callable[[], Awaitable[list[float | None]]],
        indices: list[int],
        terms: Terms,
        least: Work,
        arrival: int,
    ) -> list[float | None]:
        """The line units of a held request's first pages (of ``indices``), had in its turn
        (module docstring): kept for ``key`` where another post of the document was counted while
        it waited (a turn left untimed), else by ``count``.

        Raises:
            Overloaded: (a document) 503 ``deadline-unmeetable`` where, once its turn came, the
                requests admitted meanwhile leave it no room
                (:meth:`~ocrserve.router.Router.check_held`); 503 ``admission-timeout`` where its
                turn and count have not ended within ``router.admission_timeout_s`` of its arrival,
                at once where the turns ahead of it and its own would take longer
                (:meth:`~ocrserve.preview_turn.PreviewTurn.previewed_in_s`).
        """
        if terms.engine_class is not EngineClass.BACKGROUND:  # a single page: at once, no limit
            return await count()  # nothing awaited since _units found none kept

        turn, previewed = self._turns[terms.lane], indices[:PREVIEW_PAGES]

        async def in_turn() -> list[float | None]:
            async with turn.turn(len(previewed), key) as held:
                self.router.check_held(terms, len(indices), least, arrival)
                if (units := self._kept(key)) is not None:
                    held.untimed()
                    return units
                return await count()

        limit = self.config.router.admission_timeout_s
        left = max(0.0, limit - terms.since_arrival_s())
        if (previewed_in := turn.previewed_in_s(len(previewed), key)) > left:
            raise _admission_timeout(
                terms.lane,
                f"the {terms.lane} lane would preview the request and those before it in about {previewed_in:.0f} s, "
                f"past router.admission_timeout_s={limit:g} s of its arrival",
                previewed_in - left,
            )
        try:
            return await within(in_turn(), left)
        except TimeoutError:
            raise _admission_timeout(
                terms.lane,
                f"the {terms.lane} lane could not preview the request within router.admission_timeout_s={limit:g} s "
                "of its arrival (the requests before it are being previewed)",
                limit,
            ) from None

    async def _run_pages(
        self,
        source: Source,
        info: DocumentInfo,
        indices: list[int],
        reservation: Reservation,
        terms: Terms,
        previewed: dict[int, float | None],
    ) -> list[Attempt]:
        """Every selected page through the pipeline, concurrently, each as soon as it is decoded,
        with its line units where its preview's were counted (``previewed``, by page index).

        Decoding stops when the deadline passes: the pages not decoded by then fail with 504, and
        the router fails the ones it holds at the same deadline.
        """
        tasks: list[asyncio.Task] = []
        chunks = self.preprocessor.pages(source, info, indices, terms.engine_class)
        try:
            try:
                async with contextlib.aclosing(chunks):
                    while (chunk := await self._next_chunk(chunks, terms.deadline)) is not None:
                        tasks.extend(
                            asyncio.create_task(self.pipeline.run(p, reservation, terms, previewed.get(p.index)))
                            for p in chunk
                        )
            except DeadlinePassed as late:
                undecoded = [Attempt.failed(index, late) for index in indices[len(tasks) :]]
                return [*await asyncio.gather(*tasks), *undecoded]
            return await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()

    @staticmethod
    async def _next_chunk(chunks: AsyncIterator[list], deadline: Deadline | None) -> list | None:
        """The next chunk of decoded pages, or None after the last one.

        Raises:
            DeadlinePassed: ``deadline`` passed while the chunk was being decoded (its decoding is
                abandoned; a page in a decoding process finishes there unread).
        """
        try:
            return await within(anext(chunks), deadline.left() if deadline else None)
        except StopAsyncIteration:
            return None
        except TimeoutError:
            raise DeadlinePassed("the deadline passed while pages were being decoded") from None


def _copied(path: Path) -> Path:
    """A copy of the file at ``path`` in a new temporary file, which the caller removes."""
    fd, name = tempfile.mkstemp(prefix="ocrserve-probe-")
    os.close(fd)
    shutil.copyfile(path, name)
    return Path(name)


def _probing(lane: str, pages: int, page: int, page_s: float) -> Overloaded:
    """503 ``deadline-unmeetable`` for a request of ``pages`` pages in ``lane`` that only the cost
    model's margin for the unseen refused, whose page ``page`` (0-based) a probe now reads in about
    ``page_s`` seconds (its bound alone, with the margin): ``Retry-After`` that, at least 1."""
    wait = max(1, math.ceil(page_s))
    return Overloaded(
        f"the {lane} lane cannot promise {pages} page(s) within the request's timeout while it knows little of "
        f"what pages like these cost; its page {page + 1} is being read meanwhile, at the lowest priority, to learn "
        f"it, and kept for a retry of the same request from the same client: retry in {wait} s, or send it to be "
        "done asynchronously (Prefer: respond-async, or POST /v1/jobs)",
        slug="deadline-unmeetable",
        headers={"Retry-After": str(wait)},
    )


def _admission_timeout(lane: str, why: str, wait: float) -> Overloaded:
    """503 ``admission-timeout`` for a request of ``lane``, ``why`` it was not previewed in time,
    ``Retry-After`` ``wait`` seconds (at least 1), counted in ``ocrserve_rejections_total``."""
    metrics.REJECTIONS.labels(lane, "admission_timeout").inc()
    wait = max(1, math.ceil(wait))
    return Overloaded(f"{why}; retry in {wait} s", slug="admission-timeout", headers={"Retry-After": str(wait)})
