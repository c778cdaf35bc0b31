"""Cancellation-safe waits: the wake-up call of a polling loop (sleep until rung or until the poll
interval has passed), and awaiting something for at most a given time.

Both wait with ``asyncio.wait``: ``asyncio.wait_for`` before Python 3.12 can swallow a
cancellation that arrives as the awaited thing finishes (CPython gh-86296), which would leave a
cancelled loop or request running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def within(awaitable: Awaitable[T], seconds: float | None) -> T:
    """``await awaitable`` for at most ``seconds`` (None: no limit).

    Raises:
        TimeoutError: the time ran out; ``awaitable`` was cancelled, and its cancellation awaited
            (an async generator's ``anext`` must have stopped before the generator is closed).
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise TimeoutError
    return task.result()


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
        """Return after at most ``seconds`` (s; None: no limit), sooner if rung; the ring is then reset."""
        waiter = asyncio.ensure_future(self._rung.wait())
        try:
            await asyncio.wait({waiter}, timeout=seconds)
        finally:
            waiter.cancel()
        self._rung.clear()
