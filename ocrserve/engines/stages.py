"""The embedded engine's stage scheduler: stage priority and dynamic batching inside the engine.

The router decides which pages enter the engine; these pieces decide, inside it, which page's
stage runs next, so that an interactive page that enters beside bulk pages overtakes them at every
step (lower ``priority`` value = more urgent, as in vLLM; :mod:`ocrserve.work`):

- :class:`PriorityGate`: a page's next stage waits while a more urgent page is in the engine.
- :class:`~ocrserve.alarm.PrioritySemaphore` (used by the engine): the detection workers go to the
  most urgent waiting page first.
- :class:`RecBatcher`: recognition crops from concurrent pages are gathered into groups, sorted
  by aspect ratio, and recognized ``rec_batch_num`` at a time; the most urgent queued run goes
  next, less urgent runs pause while a more urgent page is anywhere in the engine, and an urgent
  run does not wait for a bulk run in progress: that one is on a thread of its own at low OS
  priority (:func:`background_pool`), which yields the cores to it. Runs of pages whose call was
  cancelled (deadline passed, client gone) are dropped before they start.

Nothing here polls: waits end on a wake-up (a page arriving, a run finishing, a page leaving the
engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ocrserve import metrics
from ocrserve.alarm import Alarm
from ocrserve.engines.base import PageError
from ocrserve.work import is_urgent

log = logging.getLogger(__name__)

Recognize = Callable[[list[np.ndarray], int], list[tuple[str, float]]]


def lower_thread_priority(nice: int) -> None:
    """Add ``nice`` to the calling thread's nice value (Linux, where it is a per-thread attribute:
    ``man 2 setpriority``, BUGS); elsewhere, or where refused, log and carry on.

    Raising one's own nice value needs no privilege; it cannot be lowered again without
    CAP_SYS_NICE, so this is for threads that only ever run background work.
    """
    if not nice:
        return
    try:
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, thread) + nice)
    except (AttributeError, OSError) as exc:
        log.warning("cannot lower the priority of background threads: %s", exc)


def background_pool(workers: int, nice: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads run at ``nice`` (see :func:`lower_thread_priority`), for the
    stages of less urgent pages."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=lower_thread_priority, initargs=(nice,))


class PriorityGate:
    """Stage-level priority: pages register with their priority while in the engine; before
    each stage a page waits until no more urgent page is in the engine. A stage already running
    is never interrupted."""

    def __init__(self) -> None:
        self._active: Counter[int] = Counter()
        self._changed = asyncio.Condition()
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever a page leaves the engine (a wait may be over)."""
        self._listeners.append(listener)

    @contextlib.asynccontextmanager
    async def entered(self, priority: int):
        """Register a page of ``priority`` for the duration of the block."""
        self._active[priority] += 1
        try:
            yield
        finally:
            self._active[priority] -= 1
            if not self._active[priority]:
                del self._active[priority]
            for listener in self._listeners:
                listener()
            async with self._changed:
                self._changed.notify_all()

    def clear_for(self, priority: int) -> bool:
        """True when no page more urgent than ``priority`` is in the engine."""
        return min(self._active, default=priority) >= priority

    async def turn(self, priority: int) -> None:
        """Wait until no page more urgent than ``priority`` is in the engine."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.clear_for(priority))


@dataclass(eq=False)
class _Item:
    """One page's crops waiting for recognition."""

    priority: int
    crops: list[np.ndarray]
    future: asyncio.Future


@dataclass(eq=False)
class _Group:
    """Crops gathered from several pages, recognized as a set of ONNX runs."""

    priority: int
    items: list[_Item]
    crops: list[np.ndarray] = field(init=False)
    results: list = field(init=False)
    remaining: int = field(init=False)

    def __post_init__(self) -> None:
        self.crops = [crop for item in self.items for crop in item.crops]
        self.results = [None] * len(self.crops)
        self.remaining = len(self.crops)

    @property
    def abandoned(self) -> bool:
        """True when no page of the group waits for it any more (each was answered or cancelled)."""
        return all(item.future.done() for item in self.items)

    def runs(self, size: int) -> list[list[int]]:
        """Crop indices in runs of ``size``, sorted by aspect ratio so each run pads little."""
        order = sorted(range(len(self.crops)), key=lambda i: self.crops[i].shape[1] / max(1, self.crops[i].shape[0]))
        return [order[i : i + size] for i in range(0, len(order), size)]

    def fill(self, indices: list[int], outcomes: list) -> None:
        """Record outcomes (``(text, score)`` or an exception) and answer pages that are complete."""
        for index, outcome in zip(indices, outcomes, strict=True):
            self.results[index] = outcome
        self.remaining -= len(indices)
        if self.remaining == 0:
            self._answer()

    def _answer(self) -> None:
        offset = 0
        for item in self.items:
            mine = self.results[offset : offset + len(item.crops)]
            offset += len(item.crops)
            if item.future.done():
                continue
            failure = next((r for r in mine if isinstance(r, Exception)), None)
            if failure is not None:
                item.future.set_exception(PageError(f"text recognition failed: {failure}"))
            else:
                item.future.set_result(mine)


class RecBatcher:
    """Dynamic batching of recognition crops across pages, most urgent first.

    Args:
        recognize: blocking function, crops (BGR arrays) -> one ``(text, score)`` each.
        max_batch_size: crops gathered into one group before it is formed without waiting.
        max_wait_ms: how long the first crops of a group wait for more of the same priority.
        rec_batch_num: crops per ONNX run.
        gate: the engine's :class:`PriorityGate`; a run waits while a more urgent page is in the
            engine (even one still in detection), so that page has the cores to itself.
        background_nice: nice value of the threads that run groups of priority > 0.
        workers: ONNX runs at once per priority class (urgent, background), each on a thread of
            its own (``engine.onnx.rec_workers``; ``ocrserve batch``'s actors run 2 on
            single-threaded sessions, where one run at a time uses one core only).

    :meth:`submit` is called from the event loop; ``recognize(crops, priority)`` runs up to
    ``workers`` ONNX runs at once, on dedicated threads (groups of priority > 0 on threads of
    their own, at ``background_nice``). Crops that arrive while a group runs form the next group
    (continuous batching).
    """

    def __init__(
        self,
        recognize: Recognize,
        max_batch_size: int,
        max_wait_ms: float,
        rec_batch_num: int,
        gate: PriorityGate | None = None,
        background_nice: int = 0,
        workers: int = 1,
    ):
        self._recognize = recognize
        self._gate = gate or PriorityGate()
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.rec_batch_num = rec_batch_num
        self._waiting: list[tuple[int, int, _Item]] = []  # heap of items not yet in a group
        self._runs: list[tuple[int, int, _Group, list[int]]] = []  # heap of ONNX runs to do
        self._seq = itertools.count()
        self._arrived = Alarm()  # rung by a new item, a finished run or a page leaving the engine
        self._gate.subscribe(self._arrived.ring)
        self.workers = workers
        self._thread = ThreadPoolExecutor(workers, thread_name_prefix="ocrserve-rec")
        self._background = background_pool(workers, background_nice, "ocrserve-bg-rec")
        self._busy: Counter[bool] = Counter()  # runs in progress per class: True = urgent
        self._inflight: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self.batch_sizes: deque[int] = deque(maxlen=1024)  # crops per group, recent groups

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._task = asyncio.create_task(self._loop(), name="ocrserve-rec-batcher")

    async def submit(self, crops: list[np.ndarray], priority: int = 0) -> list[tuple[str, float]]:
        """Recognize ``crops`` (grouped with other pages' crops); one ``(text, score)`` each.

        Raises:
            PageError: recognition failed on one of these crops.
        """
        item = _Item(priority, crops, asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting, (priority, next(self._seq), item))
        self._arrived.ring()
        return await item.future

    async def _loop(self) -> None:
        while True:
            if self._waiting and (not self._runs or self._waiting[0][0] < self._runs[0][0]):
                await self._form_group(wait=not self._runs)
            elif self._runs and self._may_start(self._runs[0][0]):
                self._start_next()
            else:  # nothing to do, its thread is busy, or it yields to a more urgent page in the engine
                await self._arrived.sleep(None)

    def _may_start(self, priority: int) -> bool:
        """Whether the next run, of ``priority``, may start now: one of its threads (urgent or
        background) is free and no more urgent page is in the engine."""
        return self._busy[is_urgent(priority)] < self.workers and self._gate.clear_for(priority)

    async def _form_group(self, wait: bool) -> None:
        """Gather the most urgent waiting items into a group and queue its runs. With ``wait``
        (nothing else to do), give the group up to ``max_wait_ms`` to fill."""
        priority = self._waiting[0][0]
        deadline = time.monotonic() + (self.max_wait_s if wait else 0.0)
        items: list[_Item] = []
        while True:
            while self._waiting and self._waiting[0][0] == priority and self._crops(items) < self.max_batch_size:
                items.append(heapq.heappop(self._waiting)[2])
            remaining = deadline - time.monotonic()
            if self._crops(items) >= self.max_batch_size or remaining <= 0:
                break
            await self._arrived.sleep(remaining)
        items = [item for item in items if not item.future.done()]
        if not items:
            return
        group = _Group(priority, items)
        self.batch_sizes.append(len(group.crops))
        metrics.BATCH_SIZE.observe(len(group.crops))
        for indices in group.runs(self.rec_batch_num):
            heapq.heappush(self._runs, (priority, next(self._seq), group, indices))

    @staticmethod
    def _crops(items: list[_Item]) -> int:
        return sum(len(item.crops) for item in items)

    def _start_next(self) -> None:
        """Start the next run on a thread of its class. An urgent run may start while background
        runs are in progress: the background threads' low priority then gives it the cores."""
        _, _, group, indices = heapq.heappop(self._runs)
        if group.abandoned:
            return
        urgent = is_urgent(group.priority)
        self._busy[urgent] += 1
        task = asyncio.create_task(self._run_group(group, indices))
        self._inflight.add(task)

        def finished(done: asyncio.Task) -> None:
            self._inflight.discard(done)
            self._busy[urgent] -= 1
            self._arrived.ring()

        task.add_done_callback(finished)

    async def _run_group(self, group: _Group, indices: list[int]) -> None:
        crops = [group.crops[i] for i in indices]
        try:
            outcomes = await self._run(crops, group.priority)
        except Exception:  # one crop broke the run: recognize each alone, so only its page fails
            log.exception("recognition of %d crops failed; retrying them one by one", len(crops))
            outcomes = [await self._alone(crop, group.priority) for crop in crops]
        group.fill(indices, outcomes)

    async def _run(self, crops: list[np.ndarray], priority: int) -> list[tuple[str, float]]:
        thread = self._thread if is_urgent(priority) else self._background
        return await asyncio.get_running_loop().run_in_executor(thread, self._recognize, crops, priority)

    async def _alone(self, crop: np.ndarray, priority: int):
        try:
            (outcome,) = await self._run([crop], priority)
            return outcome
        except Exception as exc:
            return exc

    async def close(self) -> None:
        """Stop the loop and the recognition threads."""
        for task in [self._task, *self._inflight]:
            if task:
                task.cancel()
        await asyncio.gather(*(t for t in [self._task, *self._inflight] if t), return_exceptions=True)
        self._thread.shutdown(wait=False, cancel_futures=True)
        self._background.shutdown(wait=False, cancel_futures=True)
