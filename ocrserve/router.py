"""Scheduling pages into the engine.

:class:`Router` is the single door to the engine: it admits at most ``engine.slots`` pages at
once so the engine never queues internally and waiting happens here, where it can be ordered.
"""

from __future__ import annotations

import asyncio

from ocrserve.engines.base import Engine
from ocrserve.pages import Page, PageResult


class Router:
    """Admission to the engine's slots.

    Args:
        engine: a started engine; its ``slots`` bound the pages in flight.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        self._slots = asyncio.Semaphore(engine.slots)

    def lane_for(self, page_count: int) -> str:
        """The lane a synchronous request of ``page_count`` pages runs in."""
        return "fast"

    async def submit(self, page: Page, *, lane: str, priority: int = 0) -> PageResult:
        """Run ``page`` through the engine once a slot is free.

        Raises:
            PageError: the engine failed on this page.
        """
        async with self._slots:
            return await self.engine.ocr_page(page, priority=priority)
