"""The wake-up call of a polling loop: sleep until rung or until the poll interval has passed."""

from __future__ import annotations

import asyncio


class Alarm:
    """Lets a loop that polls at an interval be woken early when there is work (e.g. a new page).

    A ring before :meth:`sleep` is not lost: the next sleep returns at once.
    """

    def __init__(self) -> None:
        self._rung = asyncio.Event()

    def ring(self) -> None:
        """Wake the sleeper now (or make its next sleep return at once)."""
        self._rung.set()

    async def sleep(self, seconds: float | None) -> None:
        """Return after at most ``seconds`` (s; None: no limit), sooner if rung; the ring is then reset.

        Waits with ``asyncio.wait``: ``asyncio.wait_for`` before Python 3.12 can swallow a
        cancellation that arrives as the ring does (CPython gh-86296), which would leave a
        cancelled loop running.
        """
        waiter = asyncio.ensure_future(self._rung.wait())
        try:
            await asyncio.wait({waiter}, timeout=seconds)
        finally:
            waiter.cancel()
        self._rung.clear()
