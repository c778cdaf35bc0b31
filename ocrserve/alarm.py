"""Cancellation-safe waits: the wake-up call of a polling loop (sleep until rung or until the poll
interval has passed), awaiting something for at most a given time, and a semaphore whose waiters
are served by priority.

Both wait with ``asyncio.wait``: ``asyncio.wait_for`` before Python 3.12 can swallow a
cancellation that arrives as the awaited thing finishes (CPython gh-86296), which would leave a
cancelled loop or request running.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
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


class PrioritySemaphore:
    """A semaphore whose waiters are served most urgent first (lower ``priority``), then first come,
    first served: the detection workers of the embedded engine, the decoding processes.

    Args:
        permits: holders at once.
    """

    def __init__(self, permits: int):
        self._free = permits
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._seq = itertools.count()

    async def acquire(self, priority: int) -> None:
        """Wait for a permit; hand it back with :meth:`release`. A waiter cancelled just as it was
        handed a permit passes it on."""
        if self._free and not self._waiters:
            self._free -= 1
            return
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._seq), future))
        try:
            await future  # the releaser handed its permit over
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()
            else:
                self._waiters = [w for w in self._waiters if w[2] is not future]
                heapq.heapify(self._waiters)
            raise

    def release(self) -> None:
        """Give a permit back: to the most urgent waiter, else to the free ones."""
        while self._waiters:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(None)
                return
        self._free += 1

    @contextlib.asynccontextmanager
    async def hold(self, priority: int):
        """Hold a permit for the duration of the block."""
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()
