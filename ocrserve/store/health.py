"""Whether this gateway's storage works: one :class:`StoreHealth` that intake, ``/readyz`` and the
job loops (worker, webhook sender, janitor) consult.

It tracks two conditions, each logged once when it starts and once when it ends (never a line per
failed call):

- **job store failing**: the store refuses writes or cannot be reached (SQLite read-only, disk I/O
  error, database or disk full, locked past its busy timeout, corrupt; Redis unreachable, read-only,
  out of memory, unable to persist), or the data folder takes no file (read-only, I/O error).
  Meanwhile ``/readyz`` and job submissions answer 503 with ``Retry-After``, and the job loops
  wait instead of polling the store.
- **data folder full**: a file under ``store.data_dir`` could not be written for want of space
  (``ENOSPC``) or quota (``EDQUOT``). Meanwhile job submissions answer 507 before their upload is
  staged, and the worker leaves pages queued (a page whose result could not be written goes back
  to the queue, its try not counted). ``/readyz`` stays 200: synchronous OCR needs no disk.

Any caller may report a fault (:meth:`StoreHealth.report`), but only :meth:`StoreHealth.probe`
declares recovery, because only it surely writes: one byte in ``staging/`` and one entry in the
store's dedup-cache index (:data:`PROBE_KEY`; SQLite commits nothing for a read or a change of no
rows, so a poll that finds no work proves nothing). :meth:`StoreHealth.run` probes every
``store.probe_interval_s``, and while a condition holds from 0.5 s doubling up to that interval.
The full folder counts as recovered only once ``store.min_free_mb`` are free again (or a quarter of
the file system, on a volume too small for that), so that it does not flap with each upload.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import errno
import logging
import math
import sqlite3
import time
from collections.abc import Iterator

from ocrserve import backoff
from ocrserve.alarm import Alarm
from ocrserve.config import StoreConfig
from ocrserve.errors import InsufficientStorage, ProblemError, StoreUnavailable
from ocrserve.store.base import JobStore
from ocrserve.store.files import DataDir

try:
    from redis import exceptions as redis_errors
except ImportError:  # redis-py is an optional extra
    redis_errors = None

log = logging.getLogger(__name__)
#: The dedup-cache index entry the probe writes (no file; not a sha256, so no document's key).
PROBE_KEY = "ocrserve-store-probe"
#: First wait between probes while a condition holds, seconds (doubling up to ``probe_interval_s``).
FIRST_PROBE_S = 0.5
#: ``errno`` values of a data folder out of room.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: ``errno`` values of a data folder that takes no writes at all.
BROKEN_ERRNOS = frozenset({errno.EROFS, errno.EIO, errno.EACCES, errno.EPERM})
#: Redis error replies of a server that refuses writes (its ``MISCONF``, ``OOM`` and ``READONLY``).
REDIS_REFUSALS = ("MISCONF", "OOM", "READONLY")
#: The exception types :func:`classify` may call storage faults.
FAULT_TYPES: tuple[type[Exception], ...] = (
    OSError,
    sqlite3.Error,
    *([redis_errors.RedisError] if redis_errors else []),
)
MB = 1 << 20
#: Free share of the file system that ends a full-folder condition when ``store.min_free_mb`` is more.
MAX_FREE_SHARE = 0.25


class Fault(enum.Enum):
    """What kind of storage failure an exception is."""

    STORE = "store"
    FULL = "full"


def classify(exc: BaseException) -> Fault | None:
    """The storage fault ``exc`` stands for, or None (a bug, a bad request: not the storage's)."""
    if isinstance(exc, OSError) and exc.errno in FULL_ERRNOS:
        return Fault.FULL
    if isinstance(exc, OSError) and exc.errno in BROKEN_ERRNOS:
        return Fault.STORE
    if isinstance(exc, sqlite3.OperationalError) or type(exc) is sqlite3.DatabaseError:  # not IntegrityError
        return Fault.STORE
    if redis_errors is not None and _redis_fault(exc):
        return Fault.STORE
    return None


def _redis_fault(exc: BaseException) -> bool:
    if isinstance(exc, redis_errors.ConnectionError | redis_errors.TimeoutError):
        return True
    return isinstance(exc, redis_errors.ResponseError) and any(word in str(exc) for word in REDIS_REFUSALS)


def describe(exc: BaseException) -> str:
    """A one-line reason for logs: ``No space left on device: '/data/staging/…'``,
    ``OperationalError: database or disk is full``."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {exc}"


class Condition:
    """One failure condition: whether it holds, since when, why, and how many probes failed in a row.

    Args:
        failing_message: logged (ERROR) when it starts; ``%s`` is the reason.
        recovered_message: logged (WARNING, so that it shows beside the failure) when it ends;
            ``%.0f`` is how long it held, seconds.
    """

    def __init__(self, failing_message: str, recovered_message: str):
        self.failing_message = failing_message
        self.recovered_message = recovered_message
        self.reason = ""
        self.failures = 0
        self._since = 0.0
        self._fine = asyncio.Event()
        self._fine.set()

    @property
    def holds(self) -> bool:
        """True while failing."""
        return not self._fine.is_set()

    def fail(self, exc: BaseException) -> bool:
        """Record a failure; returns True when it starts the condition (logged once)."""
        self.failures += 1
        if self.holds:
            return False
        self.reason = describe(exc)
        self._since = time.monotonic()
        self._fine.clear()
        log.error(self.failing_message, self.reason)
        return True

    def recover(self) -> None:
        """A probe passed: end the condition (logged once)."""
        self.failures = 0
        if self.holds:
            self._fine.set()
            log.warning(self.recovered_message, time.monotonic() - self._since)

    async def wait(self) -> None:
        """Return once the condition does not hold."""
        await self._fine.wait()


class StoreHealth:
    """The state of the job store and the data folder (see the module docstring).

    Args:
        store, data: the job store and data folder.
        cfg: the ``store`` section (``probe_interval_s``, ``min_free_mb``, ``cache_entries``).
    """

    def __init__(self, store: JobStore, data: DataDir, cfg: StoreConfig):
        self.store = store
        self.data = data
        self.cfg = cfg
        self.failing = Condition(
            "job store failing: %s; job submissions and /readyz answer 503 and job work waits until it recovers",
            "job store recovered after %.0f s; jobs are accepted and run again",
        )
        self.full = Condition(
            f"data folder {data.root} full: %s; job submissions answer 507 until "
            f"store.min_free_mb={cfg.min_free_mb:g} MB are free",
            "data folder has room again after %.0f s; jobs are accepted and run again",
        )
        self._alarm = Alarm()

    @property
    def retry_after(self) -> str:
        """``Retry-After`` of a 503 while the store fails, whole seconds: when it is probed next at the latest."""
        return str(math.ceil(self.cfg.probe_interval_s))

    def refusal(self) -> ProblemError | None:
        """The problem a job submission gets now: 503 with ``Retry-After`` while the store fails
        (:class:`StoreUnavailable`), 507 while the data folder is full (:class:`InsufficientStorage`),
        else None."""
        if self.failing.holds:
            return StoreUnavailable(
                "the job store is not taking writes now; try again later", headers={"Retry-After": self.retry_after}
            )
        if self.full.holds:
            return InsufficientStorage(
                "the server's data folder is full; jobs are refused until an operator or retention frees space"
            )
        return None

    def require_writable(self) -> None:
        """Refuse a job at once, before its upload is staged, while a condition holds.

        Raises:
            StoreUnavailable, InsufficientStorage: see :meth:`refusal`.
        """
        if problem := self.refusal():
            raise problem

    def require_store(self) -> None:
        """For ``/readyz``. Raises StoreUnavailable (503 with ``Retry-After``) while the store fails."""
        if self.failing.holds:
            raise StoreUnavailable(
                f"the job store is failing: {self.failing.reason}", headers={"Retry-After": self.retry_after}
            )

    def report(self, exc: BaseException) -> bool:
        """Record ``exc`` if it is a storage fault (:func:`classify`); True when it was (the caller
        then logs nothing: the condition's start is logged here, once)."""
        fault = classify(exc)
        if fault is None:
            return False
        if (self.full if fault is Fault.FULL else self.failing).fail(exc):
            self._alarm.ring()  # probe soon, then back off
        return True

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """Within the block, a storage fault is reported and re-raised as the client's problem.

        Raises:
            StoreUnavailable: 503 for a failing store.
            InsufficientStorage: 507 for a full data folder.
        """
        try:
            yield
        except Exception as exc:
            if not self.report(exc):
                raise
            raise self.refusal() from exc  # the condition the report started (or found) holds

    async def wait_store(self) -> None:
        """Return once the store works (at once if it does)."""
        await self.failing.wait()

    async def wait_writable(self) -> None:
        """Return once the store works and the data folder has room."""
        while self.failing.holds or self.full.holds:
            await self.failing.wait()
            await self.full.wait()

    async def probe(self) -> None:
        """Write to the data folder and to the store once; a condition whose write passed ends,
        one whose write failed starts (or goes on)."""
        folder = await _failure(asyncio.to_thread(self._probe_folder))
        store = await _failure(self._probe_store())
        if folder is not None and classify(folder) is Fault.FULL:
            self.full.fail(folder)
            folder = None
        else:
            self.full.recover()
        if store or folder:
            self.failing.fail(store or folder)
        else:
            self.failing.recover()

    def _probe_folder(self) -> None:
        free, size = self.data.probe()
        if self.full.holds and free < min(self.cfg.min_free_mb * MB, size * MAX_FREE_SHARE):
            raise OSError(errno.ENOSPC, f"only {free / MB:.1f} MB free, below store.min_free_mb")

    async def _probe_store(self) -> None:
        # one entry above the cache's own limit, so that the probe never evicts a document's entry
        for key in await self.store.cache_add(PROBE_KEY, self.cfg.cache_entries + 1):
            await asyncio.to_thread(self.data.remove, self.data.cache_path(key))

    async def run(self) -> None:
        """Probe every ``store.probe_interval_s`` (sooner, backing off, while a condition holds) until cancelled."""
        while True:
            await self.probe()
            failures = max(self.failing.failures, self.full.failures)
            interval = self.cfg.probe_interval_s
            await self._alarm.sleep(backoff.delay(failures, FIRST_PROBE_S, interval) if failures else interval)


async def _failure(step) -> Exception | None:
    """The exception ``await step`` raised, or None."""
    try:
        await step
    except Exception as exc:
        return exc
    return None
