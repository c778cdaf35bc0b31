"""The embedded engine's stage scheduler: stage priority and dynamic batching inside the engine.

The router decides which pages enter the engine; these pieces decide, inside it, which page's
stage runs next, by the page's :class:`~ocrserve.work.EngineClass` (the scheduling terms resolve
it once, :mod:`ocrserve.scheduling`), so that an interactive page that enters beside background
pages overtakes them at every step. A background page that has been in the engine for
``engine.onnx.aging_s`` no longer waits for interactive pages to leave (*aging*: no class
starves), but it keeps its class's threads and sessions: one thread a stage at low OS priority,
so an interactive page still gets the cores the moment it needs them. The threads and sessions
of interactive pages are kept for them alone: a background page's long stage (a large page's
detection, a dense page's recognition runs) never holds them. When aged pages ran as
interactive, a single page beside a flood of 4-page documents of large turned pages waited for
their detections and recognition runs: 2.7 and 6.2 s where it takes 0.8 s idle.

- :class:`ClassGate`: a background page's next stage waits while an interactive page is in the
  engine, until it has aged.
- :class:`~ocrserve.alarm.PrioritySemaphore` (used by the engine): the detection workers go to
  interactive waiting pages first.
- :class:`RecBatcher`: recognition crops from concurrent pages are gathered into groups of one
  class (pages of different requests and jobs share them), sorted by aspect ratio, and recognized
  ``rec_batch_num`` at a time; interactive runs go first, background runs pause while an
  interactive page is anywhere in the engine until one of their pages has aged, and an interactive
  run does not wait for a background run in progress: that one is on a thread of its own at low OS
  priority (:func:`background_pool`), which yields the cores to it. Runs of pages whose call was
  cancelled (deadline passed, client gone) are dropped before they start.

Nothing here polls: waits end on a wake-up (a page arriving, a run finishing, a page leaving the
engine).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ocrserve import metrics
from ocrserve.alarm import Alarm
from ocrserve.engines.base import PageError
from ocrserve.priority import BackgroundPriority
from ocrserve.work import EngineClass

log = logging.getLogger(__name__)

Recognize = Callable[[list[np.ndarray], int], list[tuple[str, float]]]


def background_pool(workers: int, priority: BackgroundPriority, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads run at ``priority`` (:meth:`BackgroundPriority.apply`), for the
    stages of less urgent pages."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=priority.apply)


@dataclass(eq=False)
class GatePass:
    """A page's place in the engine's :class:`ClassGate`.

    Attributes:
        engine_class: the class its terms gave it.
        entered: ``time.monotonic()`` when it entered the engine.
    """

    engine_class: EngineClass
    entered: float = field(default_factory=time.monotonic)


class ClassGate:
    """Stage-level priority by engine class, with aging: pages register with their class while in
    the engine; before each stage a background page waits while an interactive page is in the
    engine, until it has been in the engine ``aging_s`` seconds (0: never ages). A stage already
    running is never interrupted; an aged page keeps its class (module docstring).

    Args:
        aging_s: seconds after which a background page stops waiting (``engine.onnx.aging_s``).
    """

    def __init__(self, aging_s: float = 0.0) -> None:
        self.aging_s = aging_s
        self._interactive = 0
        self._waiters: set[asyncio.Future] = set()
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever a page leaves the engine (a wait may be over)."""
        self._listeners.append(listener)

    @contextlib.asynccontextmanager
    async def entered(self, engine_class: int) -> AsyncIterator[GatePass]:
        """Register a page of ``engine_class`` (a raw priority: :meth:`EngineClass.of`) for the
        duration of the block; yields its pass."""
        gate_pass = GatePass(EngineClass.of(engine_class))
        interactive = gate_pass.engine_class is EngineClass.INTERACTIVE
        self._interactive += interactive
        try:
            yield gate_pass
        finally:
            self._interactive -= interactive
            for listener in self._listeners:
                listener()
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def ages_in(self, gate_pass: GatePass, now: float | None = None) -> float | None:
        """Seconds until a background page ages (0 once it has), None when it never will."""
        if not self.aging_s:
            return None
        return max(0.0, gate_pass.entered + self.aging_s - (time.monotonic() if now is None else now))

    def clear_for(self, gate_pass: GatePass, now: float | None = None) -> bool:
        """True when the page's next stage may run: it is interactive, no interactive page is in
        the engine, or it has aged."""
        return (
            gate_pass.engine_class is EngineClass.INTERACTIVE
            or not self._interactive
            or self.ages_in(gate_pass, now) == 0.0
        )

    async def turn(self, gate_pass: GatePass) -> None:
        """Wait until :meth:`clear_for` the page (an interactive page left, or the page aged)."""
        while not self.clear_for(gate_pass):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.add(waiter)
            try:
                await asyncio.wait({waiter}, timeout=self.ages_in(gate_pass))
            finally:
                self._waiters.discard(waiter)


@dataclass(eq=False)
class _Item:
    """One page's crops waiting for recognition."""

    gate_pass: GatePass
    crops: list[np.ndarray]
    future: asyncio.Future
    seq: int


@dataclass(eq=False)
class _Group:
    """Crops gathered from several pages of one class, recognized as a set of ONNX runs."""

    engine_class: EngineClass
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


@dataclass(eq=False)
class _Run:
    """Crops of a group recognized in one ONNX run."""

    group: _Group
    indices: list[int]
    seq: int


class RecBatcher:
    """Dynamic batching of recognition crops across pages, interactive first.

    Args:
        recognize: blocking function, (crops (BGR arrays), engine class) -> one ``(text, score)``
            each; the class picks the sessions.
        max_batch_size: crops gathered into one group before it is formed without waiting.
        max_wait_ms: how long the first crops of a group wait for more of the same class.
        rec_batch_num: crops per ONNX run.
        gate: the engine's :class:`ClassGate`; a background run waits while an interactive page is
            in the engine (even one still in detection), so that page has the cores to itself,
            until one of the run's pages has aged.
        background: the priority of the threads that run background groups.
        workers: ONNX runs at once per class (interactive, background), each on a thread of its
            own (``engine.onnx.rec_workers``; ``ocrserve batch``'s actors run 2 on
            single-threaded sessions, where one run at a time uses one core only).

    :meth:`submit` is called from the event loop; ``recognize(crops, engine_class)`` runs up to
    ``workers`` ONNX runs at once per class, on dedicated threads (background runs on threads of
    their own, at ``background``). Crops that arrive while a group runs form the next group
    (continuous batching). Groups are of one class; a background run starts once the gate is clear
    for one of its pages (:meth:`ClassGate.clear_for`: no interactive page in the engine, or the
    page has aged).
    """

    def __init__(
        self,
        recognize: Recognize,
        max_batch_size: int,
        max_wait_ms: float,
        rec_batch_num: int,
        gate: ClassGate | None = None,
        background: BackgroundPriority = BackgroundPriority(),
        workers: int = 1,
    ):
        self._recognize = recognize
        self._gate = gate or ClassGate()
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.rec_batch_num = rec_batch_num
        self._waiting: list[_Item] = []  # items not yet in a group, in arrival order
        self._runs: list[_Run] = []  # ONNX runs to do, in the order they were formed
        self._seq = itertools.count()
        self._arrived = Alarm()  # rung by a new item, a finished run or a page leaving the engine
        self._gate.subscribe(self._arrived.ring)
        self.workers = workers
        self._thread = ThreadPoolExecutor(workers, thread_name_prefix="ocrserve-rec")
        self._background = background_pool(workers, background, "ocrserve-bg-rec")
        self._busy: Counter[EngineClass] = Counter()  # runs in progress per class
        self._inflight: set[asyncio.Task] = set()
        self._task: asyncio.Task | None = None
        self.batch_sizes: deque[int] = deque(maxlen=1024)  # crops per group, recent groups

    def start(self) -> None:
        """Start the batching loop on the running event loop."""
        self._task = asyncio.create_task(self._loop(), name="ocrserve-rec-batcher")

    async def submit(self, crops: list[np.ndarray], gate_pass: GatePass) -> list[tuple[str, float]]:
        """Recognize ``crops`` of the page holding ``gate_pass`` (grouped with other pages' crops);
        one ``(text, score)`` each.

        Raises:
            PageError: recognition failed on one of these crops.
        """
        item = _Item(gate_pass, crops, asyncio.get_running_loop().create_future(), next(self._seq))
        self._waiting.append(item)
        self._arrived.ring()
        return await item.future

    async def _loop(self) -> None:
        while True:
            now = time.monotonic()
            waiting = min((item.gate_pass.engine_class for item in self._waiting), default=None)
            run = min(self._runs, key=lambda r: (r.group.engine_class, r.seq), default=None)
            if waiting is not None and (run is None or waiting < run.group.engine_class):
                await self._form_group(waiting, wait=not self._runs)
            elif run is not None and self._may_start(run, now):
                self._start(run, run.group.engine_class)
            else:  # nothing to do, its thread is busy, or it yields to an interactive page in the engine
                await self._arrived.sleep(self._next_aging(now))

    def _next_aging(self, now: float) -> float | None:
        """Seconds until the next background page waiting here ages (None: none will)."""
        passes = [item.gate_pass for item in self._waiting]
        passes += [item.gate_pass for run in self._runs for item in run.group.items]
        times = [t for p in passes if (t := self._gate.ages_in(p, now))]
        return min(times, default=None)

    def _may_start(self, run: _Run, now: float) -> bool:
        """Whether ``run`` may start now: one of its class's threads is free and the gate is clear
        for one of its pages."""
        engine_class = run.group.engine_class
        clear = any(self._gate.clear_for(item.gate_pass, now) for item in run.group.items)
        return self._busy[engine_class] < self.workers and clear

    async def _form_group(self, engine_class: EngineClass, wait: bool) -> None:
        """Gather the waiting items that run as ``engine_class`` into a group and queue its runs.
        With ``wait`` (nothing else to do), give the group up to ``max_wait_ms`` to fill."""
        deadline = time.monotonic() + (self.max_wait_s if wait else 0.0)
        items: list[_Item] = []
        while True:
            for item in list(self._waiting):
                if self._crops(items) >= self.max_batch_size:
                    break
                if item.gate_pass.engine_class is engine_class:
                    self._waiting.remove(item)
                    items.append(item)
            remaining = deadline - time.monotonic()
            if self._crops(items) >= self.max_batch_size or remaining <= 0:
                break
            await self._arrived.sleep(remaining)
        items = [item for item in items if not item.future.done()]
        if not items:
            return
        group = _Group(engine_class, items)
        self.batch_sizes.append(len(group.crops))
        metrics.BATCH_SIZE.observe(len(group.crops))
        self._runs.extend(_Run(group, indices, next(self._seq)) for indices in group.runs(self.rec_batch_num))

    @staticmethod
    def _crops(items: list[_Item]) -> int:
        return sum(len(item.crops) for item in items)

    def _start(self, run: _Run, engine_class: EngineClass) -> None:
        """Start ``run`` as ``engine_class`` on a thread of that class. An interactive run may start
        while background runs are in progress: the background threads' low priority then gives it
        the cores."""
        self._runs.remove(run)
        if run.group.abandoned:
            return
        self._busy[engine_class] += 1
        task = asyncio.create_task(self._run_group(run.group, run.indices, engine_class))
        self._inflight.add(task)

        def finished(done: asyncio.Task) -> None:
            self._inflight.discard(done)
            self._busy[engine_class] -= 1
            self._arrived.ring()

        task.add_done_callback(finished)

    async def _run_group(self, group: _Group, indices: list[int], engine_class: EngineClass) -> None:
        crops = [group.crops[i] for i in indices]
        try:
            outcomes = await self._run(crops, engine_class)
        except Exception:  # one crop broke the run: recognize each alone, so only its page fails
            log.exception("recognition of %d crops failed; retrying them one by one", len(crops))
            outcomes = [await self._alone(crop, engine_class) for crop in crops]
        group.fill(indices, outcomes)

    async def _run(self, crops: list[np.ndarray], engine_class: EngineClass) -> list[tuple[str, float]]:
        thread = self._thread if engine_class is EngineClass.INTERACTIVE else self._background
        return await asyncio.get_running_loop().run_in_executor(thread, self._recognize, crops, engine_class)

    async def _alone(self, crop: np.ndarray, engine_class: EngineClass):
        try:
            (outcome,) = await self._run([crop], engine_class)
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
