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

    async def sleep(self, seconds: float) -> None:
        """Return after at most ``seconds`` (s), sooner if rung; the ring is then reset."""
        await wait_event(self._rung, seconds)
        self._rung.clear()


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait until ``event`` is set or ``timeout`` seconds (None: no limit) have passed.

    Unlike ``asyncio.wait_for`` before Python 3.12, this never swallows a cancellation that
    arrives as the event is set (CPython gh-86296), which would leave a cancelled loop running.
    """
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()
