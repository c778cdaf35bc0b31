"""Work bound to its HTTP client: cancelled when the client disconnects."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import Request

from ocrserve.errors import ClientGone

T = TypeVar("T")


async def until_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (which drops its queued pages and aborts
    its running ones) if the client goes away.

    Raises:
        ClientGone: the client disconnected first.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    if task in done:
        return task.result()
    raise ClientGone("the client disconnected")


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
