"""Decoding processes, each bounded in memory and time, that a poison document cannot share.

Every decoder call on a client's file runs in a :class:`DecodePool` worker: a process of its own
(one task at a time) whose address space is capped (``RLIMIT_AS``, ``preprocess.worker_memory_mb``)
and whose task is killed when it runs past ``preprocess.page_timeout_s`` per page. Because a
worker runs one task only, a worker that dies (the kernel's OOM killer, a decoder's crash, the
time limit) names its document: that document is answered :class:`~ocrserve.errors.PoisonDocument`
(422) at once and never tried again, and no neighbour's work is lost. A worker still holding more
than ``preprocess.worker_recycle_mb`` after a task (heap fragmentation after a large page) is
replaced. Workers die with the gateway, even by ``kill -9``, and rate-limit decoder warnings.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import resource
import signal
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from typing import Any

from ocrserve import heap
from ocrserve.alarm import PrioritySemaphore, within
from ocrserve.config import PreprocessConfig
from ocrserve.errors import PoisonDocument
from ocrserve.priority import BackgroundPriority

log = logging.getLogger(__name__)

#: ``PR_SET_PDEATHSIG`` (``linux/prctl.h``): the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1
#: Decoder warnings a decoding process writes to the log per minute; the rest are counted.
WARNINGS_PER_MINUTE = 10
MIB = 2**20


def _worker_init(gateway_pid: int, memory_mb: int, priority: BackgroundPriority) -> None:
    # Each worker decodes one page at a time; keep native libraries from spawning thread pools.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    priority.apply()
    # Ctrl-C reaches the terminal's whole process group: the gateway drains, then closes the pool,
    # which ends this process; a KeyboardInterrupt here would lose its page and print a traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.showwarning = RateLimitedWarnings(WARNINGS_PER_MINUTE)
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * MIB, memory_mb * MIB))
    _die_with(gateway_pid)


def _task(fn: Callable, args: tuple) -> Any:
    """Run ``fn(*args)`` in the worker, then hand freed heap back to the kernel, so a large page
    does not leave the worker holding its peak."""
    try:
        return fn(*args)
    finally:
        heap.trim()


class RateLimitedWarnings:
    """A ``warnings.showwarning`` that logs at most ``per_minute`` warnings a minute and then one
    line counting those it held back: a malformed file can make Pillow warn once per EXIF tag (a
    small PNG wrote 13 MB of "Skipping tag" lines), which must not flood the gateway's log.

    Args:
        per_minute: warnings logged per 60 s window.
    """

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self.window_start = 0.0
        self.shown = 0
        self.held = 0

    def __call__(self, message, category, filename, lineno, file=None, line=None) -> None:
        now = time.monotonic()
        if now - self.window_start >= 60:
            if self.held:
                log.warning("%d more decoder warnings in the last minute were not logged", self.held)
            self.window_start, self.shown, self.held = now, 0, 0
        if self.shown < self.per_minute:
            self.shown += 1
            log.warning("%s: %s (%s:%d)", category.__name__, message, filename, lineno)
        else:
            self.held += 1


def _die_with(gateway_pid: int) -> None:
    """Have the kernel SIGKILL this decoding process when the gateway dies, even by ``kill -9``
    (``man 2 prctl``, ``PR_SET_PDEATHSIG``), so no orphan keeps decoding; and exit at once if it
    died already, while this process was still starting. Linux only; elsewhere the pool's own
    shutdown is all there is."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        log.warning("decoding process cannot ask to die with the gateway: errno %d", ctypes.get_errno())
    if os.getppid() != gateway_pid:
        os._exit(0)


def resident_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MiB (``/proc/<pid>/statm``); None where unknown."""
    try:
        with open(f"/proc/{pid}/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
    except (OSError, ValueError, IndexError):
        return None


def _retrieve(done: asyncio.Future) -> None:
    """Mark ``done``'s outcome as seen (nobody awaits it), so asyncio logs no "never retrieved"."""
    if not done.cancelled():
        done.exception()


def _running(pid: int | None) -> bool:
    """Whether process ``pid`` exists and is no zombie (``/proc/<pid>/stat``; True where there is
    no ``/proc``, leaving the pool's own detection)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")
    except (OSError, IndexError):
        return True


class WorkerLost(Exception):
    """A decoding process was found dead before it was given a task: not the task's fault."""


class _Worker:
    """One decoding process: a one-process executor, so a crash breaks nothing but its own task."""

    def __init__(self, cfg: PreprocessConfig, priority: BackgroundPriority):
        self.executor = ProcessPoolExecutor(
            1,
            mp_context=get_context("spawn"),
            initializer=_worker_init,
            initargs=(os.getpid(), cfg.worker_memory_mb, priority),
        )
        self.pid: int | None = None
        self.dead = False
        self._starting: asyncio.Future | None = None

    async def start(self) -> None:
        """Start the process, if no one has yet, and learn its pid.

        Raises:
            WorkerLost: it died while starting.
        """
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())
            self._starting.add_done_callback(_retrieve)
        await asyncio.shield(self._starting)

    async def _start(self) -> None:
        try:
            self.pid = await asyncio.get_running_loop().run_in_executor(self.executor, os.getpid)
        except BrokenProcessPool:
            self.dead = True
            raise WorkerLost from None

    def call(self, fn: Callable, args: tuple) -> asyncio.Future:
        """``fn(*args)`` in this started process.

        Raises:
            WorkerLost: the process had died before the task was handed to it.
            BrokenProcessPool: (from the future) the process died running the task.
        """
        if not _running(self.pid):  # killed while idle, and its pool may not have noticed yet
            self.dead = True
            raise WorkerLost
        try:
            return asyncio.get_running_loop().run_in_executor(self.executor, _task, fn, args)
        except BrokenProcessPool:
            self.dead = True
            raise WorkerLost from None

    def kill(self) -> None:
        self.dead = True
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def close(self, wait: bool) -> None:
        self.executor.shutdown(wait=wait, cancel_futures=True)


class DecodePool:
    """Decoding processes, each running one task at a time; a free process goes to the most urgent
    waiting task (lower ``priority``, as in :mod:`ocrserve.work`).

    Args:
        cfg: the workers' limits (``workers``, ``worker_memory_mb``, ``worker_recycle_mb``,
            ``page_timeout_s``).
        size: processes; None: ``cfg.workers`` (0: one per core).
        priority: how each process yields the cores (the default: as the gateway's own).
    """

    def __init__(
        self, cfg: PreprocessConfig, size: int | None = None, priority: BackgroundPriority = BackgroundPriority()
    ):
        self.cfg = cfg
        self.size = size or cfg.workers or os.cpu_count() or 1
        self.priority = priority
        self._workers = [_Worker(cfg, self.priority) for _ in range(self.size)]
        self._idle = list(self._workers)
        self._turn = PrioritySemaphore(self.size)  # one permit per idle worker

    async def run(self, fn: Callable, *args: Any, pages: int = 1, priority: int = 0) -> Any:
        """``fn(*args)`` in the next free worker, most urgent ``priority`` first, within ``pages x
        cfg.page_timeout_s`` seconds.

        ``fn`` and its arguments must pickle. A caller that is cancelled leaves the task to finish
        (or reach its time limit) before the worker takes another.

        Raises:
            PoisonDocument: the worker died or ran out of time on this task (422).
            Exception: whatever ``fn`` raised.
        """
        await self._turn.acquire(priority)
        worker = self._idle.pop()
        task = asyncio.ensure_future(self._supervise(worker, fn, args, pages * self.cfg.page_timeout_s))
        task.add_done_callback(_retrieve)  # a gone caller's outcome is nobody's
        return await asyncio.shield(task)

    async def _supervise(self, worker: _Worker, fn: Callable, args: tuple, timeout_s: float) -> Any:
        try:
            try:
                await worker.start()
                future = worker.call(fn, args)
            except WorkerLost:  # it died idle (killed from outside): the task goes to a fresh one
                worker = self._fit(worker)
                await worker.start()
                future = worker.call(fn, args)
            return await within(future, timeout_s)
        except TimeoutError:
            worker.kill()
            raise PoisonDocument(
                f"decoding took longer than {timeout_s:g} s (preprocess.page_timeout_s="
                f"{self.cfg.page_timeout_s:g} per page); the decoding process was stopped",
                slug="decode-timeout",
            ) from None
        except BrokenProcessPool:
            worker.dead = True
            raise PoisonDocument(
                "decoding this document killed its decoding process (a decoder crash, or memory "
                f"beyond preprocess.worker_memory_mb={self.cfg.worker_memory_mb})",
                slug="decoder-crashed",
            ) from None
        finally:
            self._idle.append(self._fit(worker))
            self._turn.release()

    def _fit(self, worker: _Worker) -> _Worker:
        """``worker``, or a fresh one in its place when it died or holds too much memory."""
        held = resident_mb(worker.pid) if worker.pid is not None and not worker.dead else None
        if not worker.dead and (held is None or held < self.cfg.worker_recycle_mb):
            return worker
        if held is not None:
            log.info("replacing a decoding process holding %.0f MiB (preprocess.worker_recycle_mb)", held)
        worker.close(wait=False)
        fresh = _Worker(self.cfg, self.priority)
        self._workers[self._workers.index(worker)] = fresh
        asyncio.ensure_future(fresh.start()).add_done_callback(_retrieve)  # ready for the next task
        return fresh

    def pids(self) -> list[int]:
        """Process ids of the workers started so far."""
        return [w.pid for w in self._workers if w.pid is not None and not w.dead]

    async def warm_up(self) -> None:
        """Start every worker process now rather than on the first request."""
        await asyncio.gather(*(self.run(os.getpid) for _ in range(self.size)))

    def close(self) -> None:
        """Stop the worker processes (waits for them to exit)."""
        for worker in self._workers:
            worker.close(wait=True)
