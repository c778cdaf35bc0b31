"""A lane's turn to preview documents before admission, and how long a document arriving now
would wait for it.

Documents are previewed and their line units counted one at a time per lane, in the order they
came (:mod:`ocrserve.service`); one whose turn has not ended within ``router.admission_timeout_s``
of its arrival is refused. A :class:`PreviewTurn` counts the documents waiting for it and times
the turns that end, so that a document that the turns ahead of it would keep past that limit is
refused on arrival rather than at the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator

#: Turns timed for :meth:`PreviewTurn.ahead_s` (the newest kept).
TURNS_KEPT = 16
#: Turns timed before :meth:`PreviewTurn.ahead_s` says anything. A flood whose clients come back
#: together ends one or two turns a round of itself (the rest are cut at the limit): at 4 the turns
#: ahead were priced only after four rounds, and its refusals still came at 10.1-10.4 s. At 2, a
#: flood of 4-page documents of turned pages marked bulk beside a single page every 0.5 s (held-out
#: seed 31, 2 cores) was refused at a median of 0.33 s against 7.17 s before (3 of 55 and 4 of 35
#: accepted, none late), and a warm burst of twelve 2-page receipts beside a CPU hog was admitted
#: as before (4 of 12, all in time).
ENOUGH_TURNS = 2


class PreviewTurn:
    """One document's previews at a time, in the order they came, with a count of the documents
    waiting and the seconds of the last :data:`TURNS_KEPT` turns."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._waiting = 0  # documents waiting for the turn, not in it
        self._began: float | None = None  # time.monotonic() when the turn now held began
        self._took: deque[float] = deque(maxlen=TURNS_KEPT)

    def ahead_s(self) -> float:
        """Seconds until a document arriving now gets the turn, by the median of the turns timed:
        the turn held now (what is left of the median, at least none) and one median for each
        document waiting. The median, not the mean: a turn that refuses its document before its
        previews (the requests admitted meanwhile left it no room) takes milliseconds, and a
        burst's turns mix those with whole previews. 0 until :data:`ENOUGH_TURNS` were timed."""
        if len(self._took) < ENOUGH_TURNS:
            return 0.0
        typical = statistics.median(self._took)
        held = 0.0 if self._began is None else max(0.0, typical - (time.monotonic() - self._began))
        return held + self._waiting * typical

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        """Wait for the turn, hold it for the block, and time it where the block ended of itself
        (previewed, or refused): one cancelled, while waiting or in the turn, leaves untimed. In a
        flood whose documents were cut at ``router.admission_timeout_s`` while the turn ahead of
        them ran, those cut in the turn took 0.01-0.8 s of it, the turns that ended of themselves
        1.9-8.1 s, and timed with the rest the cut ones held the median at a tenth of a second."""
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        self._began = time.monotonic()
        timed = True
        try:
            yield
        except asyncio.CancelledError:  # cut short at its request's limit: not how long a turn takes
            timed = False
            raise
        finally:
            if timed:
                self._took.append(time.monotonic() - self._began)
            self._began = None
            self._lock.release()
