"""The wake-up call of a polling loop: sleep until rung or until the poll interval has passed."""

from __future__ import annotations

import asyncio
import contextlib


class Alarm:
    """Lets a loop that polls at an interval be woken early when there is work (e.g. a new page).

    A ring before :meth:`sleep` is not lost: the next sleep returns at once.
    """

    def __init__(self) -> None:
        self._rung = asyncio.Event()

    def ring(self) -> None:
        """Wake the sleeper now (or make its next sleep return at once)."""
        self._rung.set()

    async def sleep(self, seconds: float) -> None:
        """Return after at most ``seconds`` (s), sooner if rung; the ring is then reset."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._rung.wait(), seconds)
        self._rung.clear()
