"""A lane's turn to preview documents before admission, and how long a document arriving now
would wait for it.

Documents are previewed and their line units counted one at a time per lane, in the order they
came (:mod:`ocrserve.service`); one whose turn has not ended within ``router.admission_timeout_s``
of its arrival is refused. A :class:`PreviewTurn` counts the pages of the documents waiting for it
and times the turns that end, in seconds a previewed page, so that a document that the turns
ahead of it and its own would keep past that limit is refused on arrival rather than at the limit.
Posts of one document count its pages once: the first to take the turn counts its line units, and
the others take them, kept, when theirs comes (:class:`HeldTurn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Hashable

#: Turns timed for :meth:`PreviewTurn.previewed_in_s` (the newest kept).
TURNS_KEPT = 16
#: Turns timed before :meth:`PreviewTurn.previewed_in_s` goes by them alone; until then the prior
#: (:data:`PRIOR_PAGE_S`) counts as one turn more. A flood whose clients come back together ends
#: one or two turns a round of itself (the rest are cut at the limit): at 4 the turns ahead were
#: priced only after four rounds, and its refusals still came at 10.1-10.4 s. At 2, a flood of
#: 4-page documents of turned pages marked bulk beside a single page every 0.5 s (held-out seed 31,
#: 2 cores) was refused at a median of 0.33 s against 7.17 s before (3 of 55 and 4 of 35 accepted,
#: none late), and a warm burst of twelve 2-page receipts beside a CPU hog was admitted as before
#: (4 of 12, all in time).
ENOUGH_TURNS = 2
#: A previewed page's seconds in the turn before any turn was timed: decoding its preview (up to
#: 0.3 s, :meth:`~ocrserve.preprocess.Preprocessor.previews`) and counting its line units (up to
#: 0.39 s, :mod:`ocrserve.preprocess.lines`) on a quiet 2-core machine. Without it nothing was
#: ahead of a fresh gateway's first burst: eight clients posting 5-page receipts beside a single
#: page every 0.5 s (development seed 22, 2 cores) all queued for the turn, the turns took
#: 4.2-5.8 s (1.0-1.5 s a previewed page, the engine beside them), and seven of the eight were
#: refused at the 10 s limit, then six of seven in the second round, whose one timed turn said
#: nothing yet.
PRIOR_PAGE_S = 0.7


class HeldTurn:
    """The turn a document holds (:meth:`PreviewTurn.turn`), timed when it ends unless
    :meth:`untimed`."""

    def __init__(self) -> None:
        self.timed = True

    def untimed(self) -> None:
        """Leave this turn out of the turns timed: it took its line units kept from an earlier turn
        of the same document, in milliseconds. Timed, such turns made the median turn nothing
        (turns of 0.5, 0, 0 and 0 s a page price any turns ahead at 0 s): twelve clients posting
        one 2-page document at once, then twelve new 2- to 4-page documents marked bulk 5 s later
        (2 cores), had 8 and 9 of the new ones queue and be cut at the 10-s
        ``router.admission_timeout_s``; untimed, 1, and 7 were refused on arrival."""
        self.timed = False


class PreviewTurn:
    """One document's previews at a time, in the order they came, with the pages of the documents
    waiting and the seconds a previewed page of the last :data:`TURNS_KEPT` turns.

    Args:
        prior_page_s: a previewed page's seconds before turns were timed (:data:`PRIOR_PAGE_S`).
    """

    def __init__(self, prior_page_s: float = PRIOR_PAGE_S) -> None:
        self._prior_page_s = prior_page_s
        self._lock = asyncio.Lock()
        self._waiting: Counter[Hashable] = Counter()  # posts of each document waiting for the turn
        self._pages: dict[Hashable, int] = {}  # previewed pages of each document waiting
        self._held: tuple[float, int, Hashable] | None = None  # (time.monotonic(), pages, document) held now
        self._took: deque[float] = deque(maxlen=TURNS_KEPT)  # seconds a previewed page, newest last

    def previewed_in_s(self, pages: int, document: Hashable) -> float:
        """Seconds until a post of ``document`` (its content and pages, any hashable), of ``pages``
        previewed pages, arriving now has been previewed: a typical turn's seconds a page (the
        median of the turns timed, the prior counted as one while fewer than :data:`ENOUGH_TURNS`
        were) times the pages of the turn held now (less what it has run, at least none), of each
        document waiting (once for all its posts) and its own (none where a post of it is ahead: it
        will take their units, kept). The median, not the mean: a turn that refuses its document
        before its previews (the requests admitted meanwhile left it no room) takes milliseconds,
        and a burst's turns mix those with whole previews. Its own pages count: by the turns ahead
        alone, documents of a flood of 5-page receipts beside a single page every 0.5 s
        (development seed 22, 2 cores) got the turn a moment before their limit, and four of them
        were cut 1.3-6.4 s into their previews."""
        typical = self._typical_page_s()
        held, held_document = 0.0, None
        if self._held is not None:
            began, held_pages, held_document = self._held
            held = max(0.0, typical * held_pages - (time.monotonic() - began))
        waiting = sum(n for other, n in self._pages.items() if other != held_document)
        own = 0 if document in self._waiting or document == held_document else max(1, pages)
        return held + (waiting + own) * typical

    def _typical_page_s(self) -> float:
        """A turn's seconds a previewed page: the median of the turns timed, and of the prior too
        while fewer than :data:`ENOUGH_TURNS` were."""
        took = list(self._took)
        return statistics.median(took if len(took) >= ENOUGH_TURNS else [self._prior_page_s, *took])

    @contextlib.asynccontextmanager
    async def turn(self, pages: int, document: Hashable) -> AsyncIterator[HeldTurn]:
        """Wait for the turn to preview ``pages`` pages (at least 1) of ``document`` (as
        :meth:`previewed_in_s`), hold it for the block, and time it, unless the block left it
        :meth:`~HeldTurn.untimed`, where the block ended of itself (previewed, or refused), or was
        cancelled in the turn (its request cut at its limit) after longer than a typical turn
        (:meth:`previewed_in_s`): the turn took at least that. In a flood whose documents were cut
        at ``router.admission_timeout_s`` while the turn ahead of them ran, those cut in the turn
        took 0.01-0.8 s of it, the turns that ended of themselves 1.9-8.1 s, and timed with the
        rest the cut ones held the median at a tenth of a second. Beside a CPU hog, a flood of
        2-page dense documents marked bulk (development seed 22, 2 cores) had every turn cut, the
        first after 10 s, and untimed, the turns ahead were priced by the prior (0.7 s a page) to
        the end."""
        pages = max(1, pages)
        self._waiting[document] += 1
        self._pages[document] = pages
        try:
            await self._lock.acquire()
        finally:
            self._waiting[document] -= 1
            if not self._waiting[document]:
                del self._waiting[document], self._pages[document]
        began, held = time.monotonic(), HeldTurn()
        self._held = (began, pages, document)
        cut = False
        try:
            yield held
        except asyncio.CancelledError:
            cut = True
            raise
        finally:
            page_s = (time.monotonic() - began) / pages
            if held.timed and (not cut or page_s > self._typical_page_s()):
                self._took.append(page_s)
            self._held = None
            self._lock.release()
