"""The embedded job store: one SQLite file in WAL mode, no server needed.

WAL lets status reads run while a worker writes; every change is one ``BEGIN IMMEDIATE``
transaction, so several gateway processes on one host may share the file. All calls run on one
thread that owns the connection (sqlite3 connections are not shared between threads), off the
event loop.

A page row's ``due`` serves both states that can be claimed: for a ``queued`` page it is when it may
be claimed (0, or the end of a retry backoff); for a ``running`` page it is when its lease ends. So
one indexed query finds every claimable page (``due <= now``) in priority order.

A file made by an earlier version is brought up to date when opened (:data:`ADDED_COLUMNS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ocrserve.store.base import IdempotencyConflict, JobStore, quota_exceeded
from ocrserve.store.job_records import (
    TERMINAL,
    Claim,
    Completion,
    Event,
    Job,
    JobStatus,
    PageOutcome,
    PageRecord,
    PageState,
    final_status,
    idempotency_scope,
    page_event,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    status TEXT NOT NULL,
    priority INTEGER NOT NULL,
    created REAL NOT NULL,
    finished REAL NOT NULL DEFAULT 0,
    pages_total INTEGER NOT NULL,
    pages_ok INTEGER NOT NULL DEFAULT 0,
    pages_failed INTEGER NOT NULL DEFAULT 0,
    events INTEGER NOT NULL DEFAULT 0,
    spec TEXT NOT NULL,                 -- Job.to_json(): documents, model, webhook_url, request_hash
    idempotency_key TEXT UNIQUE,        -- job_records.idempotency_scope(tenant, Idempotency-Key)
    webhook_due REAL,                   -- NULL: nothing to send; else when it may next be claimed
    tenant TEXT NOT NULL DEFAULT ''     -- the owner; '' = anonymous
);
CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished) WHERE finished > 0;
CREATE INDEX IF NOT EXISTS jobs_webhook ON jobs (webhook_due) WHERE webhook_due IS NOT NULL;
CREATE TABLE IF NOT EXISTS pages (
    job TEXT NOT NULL,
    seq INTEGER NOT NULL,
    document INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    priority INTEGER NOT NULL,          -- the job's, copied for the claim order
    created REAL NOT NULL,
    state TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    due REAL NOT NULL DEFAULT 0,        -- queued: claimable from; running: lease end
    owner TEXT,
    token TEXT,
    result_path TEXT NOT NULL DEFAULT '',
    error TEXT,
    PRIMARY KEY (job, seq)
);
CREATE INDEX IF NOT EXISTS pages_claimable ON pages (priority DESC, created, job, seq)
    WHERE state IN ('queued', 'running');
CREATE TABLE IF NOT EXISTS events (
    job TEXT NOT NULL,
    id INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (job, id)
);
CREATE TABLE IF NOT EXISTS cache (
    key TEXT PRIMARY KEY,
    used REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS cache_used ON cache (used);
"""
#: Columns added after the first release, ``(table, column, definition)``: added to an older file
#: when it is opened (SQLite's ``ALTER TABLE ... ADD COLUMN``), before :data:`LATE_INDEX`.
ADDED_COLUMNS = (("jobs", "tenant", "TEXT NOT NULL DEFAULT ''"),)
#: The index on an added column, for :meth:`SqliteStore.pending_pages`: the open jobs of a tenant.
LATE_INDEX = "CREATE INDEX IF NOT EXISTS jobs_open ON jobs (tenant) WHERE finished = 0"
#: Seconds a writer waits for another process's transaction before giving up.
BUSY_TIMEOUT_S = 30.0


class SqliteStore(JobStore):
    """:class:`~ocrserve.store.base.JobStore` in one SQLite database file.

    Args:
        path: the database file (created with its folder if missing).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ocrserve-sqlite")
        self._db: sqlite3.Connection | None = None

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # durable across process crashes; WAL syncs at checkpoints
            db.executescript(SCHEMA)
            _migrate(db)
            self._db = db
        return self._db

    def _tx(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return _transaction(self._conn())

    # jobs --------------------------------------------------------------------------------------

    async def create(self, job, idempotency_key="", finished=None, max_pending_pages=0):
        return await self._call(self._create, job, idempotency_key, finished or {}, max_pending_pages)

    def _create(self, job: Job, key: str, finished: dict[int, PageOutcome], quota: int) -> tuple[Job, bool]:
        scoped = idempotency_scope(job.tenant, key)
        with self._tx() as db:
            if scoped:
                row = db.execute("SELECT * FROM jobs WHERE idempotency_key = ?", (scoped,)).fetchone()
                if row is not None:
                    earlier = _job(row)
                    if earlier.request_hash != job.request_hash:
                        raise IdempotencyConflict(
                            f"Idempotency-Key {key!r} was used for job {earlier.id} with a different request"
                        )
                    return earlier, False
            adding = job.pages_total - len(finished)
            if quota and adding:
                pending = self._pending(db, job.tenant)
                if pending + adding > quota:
                    raise quota_exceeded(job.tenant, pending, adding, quota)
            db.execute(
                "INSERT INTO jobs (id, status, priority, created, pages_total, spec, idempotency_key, tenant)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job.id,
                    JobStatus.QUEUED,
                    job.priority,
                    job.created,
                    job.pages_total,
                    json.dumps(job.to_json()),
                    scoped or None,
                    job.tenant,
                ),
            )
            db.executemany(
                "INSERT INTO pages (job, seq, document, idx, priority, created, state) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (job.id, seq, d, i, job.priority, job.created, PageState.QUEUED)
                    for seq, (d, i) in enumerate(job.page_refs())
                ],
            )
            for seq, outcome in sorted(finished.items()):
                self._finish(db, job.id, seq, outcome)
            return _job(db.execute("SELECT * FROM jobs WHERE id = ?", (job.id,)).fetchone()), True

    async def pending_pages(self, tenant):
        return await self._call(lambda: self._pending(self._conn(), tenant))

    @staticmethod
    def _pending(db: sqlite3.Connection, tenant: str) -> int:
        """Unfinished pages of the tenant's open jobs (``finished = 0`` until a job ends or is cancelled)."""
        row = db.execute(
            "SELECT COALESCE(SUM(pages_total - pages_ok - pages_failed), 0) FROM jobs"
            " WHERE tenant = ? AND finished = 0",
            (tenant,),
        ).fetchone()
        return row[0]

    async def get(self, job_id):
        return await self._call(self._get, job_id)

    def _get(self, job_id: str) -> Job | None:
        row = self._conn().execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _job(row) if row else None

    async def pages(self, job_id):
        return await self._call(self._pages, job_id)

    def _pages(self, job_id: str) -> list[PageRecord]:
        rows = self._conn().execute("SELECT * FROM pages WHERE job = ? ORDER BY seq", (job_id,)).fetchall()
        return [
            PageRecord(
                r["seq"],
                r["document"],
                r["idx"],
                PageState(r["state"]),
                r["attempts"],
                r["result_path"],
                json.loads(r["error"]) if r["error"] else None,
            )
            for r in rows
        ]

    # claims ------------------------------------------------------------------------------------

    async def claim(self, owner, limit, lease_s):
        return await self._call(self._claim, owner, limit, lease_s)

    def _claim(self, owner: str, limit: int, lease_s: float) -> list[Claim]:
        now = time.time()
        with self._tx() as db:
            rows = db.execute(
                "SELECT job, seq, document, idx, attempts, state, owner FROM pages"
                " WHERE state IN ('queued', 'running') AND due <= ?"
                " ORDER BY priority DESC, created, job, seq LIMIT ?",
                (now, limit),
            ).fetchall()
            claims = [
                Claim(
                    r["job"],
                    r["seq"],
                    r["document"],
                    r["idx"],
                    r["attempts"] + 1,
                    secrets.token_hex(8),
                    (r["owner"] or "?") if r["state"] == PageState.RUNNING else "",  # a lapsed lease
                )
                for r in rows
            ]
            for claim in claims:
                db.execute(
                    "UPDATE pages SET state = ?, attempts = ?, due = ?, owner = ?, token = ? WHERE job = ? AND seq = ?",
                    (PageState.RUNNING, claim.attempts, now + lease_s, owner, claim.token, claim.job_id, claim.seq),
                )
                db.execute(
                    "UPDATE jobs SET status = ? WHERE id = ? AND status = ?",
                    (JobStatus.RUNNING, claim.job_id, JobStatus.QUEUED),
                )
            return claims

    async def renew(self, claims, lease_s):
        return await self._call(self._renew, claims, lease_s)

    def _renew(self, claims: list[Claim], lease_s: float) -> list[Claim]:
        due = time.time() + lease_s
        with self._tx() as db:
            return [
                t
                for t in claims
                if not db.execute(
                    "UPDATE pages SET due = ? WHERE job = ? AND seq = ? AND token = ? AND state = ?",
                    (due, t.job_id, t.seq, t.token, PageState.RUNNING),
                ).rowcount
            ]

    async def complete(self, claim, outcome):
        return await self._call(self._complete, claim, outcome)

    def _complete(self, claim: Claim, outcome: PageOutcome) -> Completion:
        with self._tx() as db:
            return self._finish(db, claim.job_id, claim.seq, outcome)

    def _finish(self, db: sqlite3.Connection, job_id: str, seq: int, outcome: PageOutcome) -> Completion:
        """Finish one page inside a transaction, unless it (or its job) already has."""
        job = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        page = db.execute("SELECT * FROM pages WHERE job = ? AND seq = ?", (job_id, seq)).fetchone()
        if (
            job is None
            or page is None
            or job["status"] in TERMINAL
            or page["state"] not in (PageState.QUEUED, PageState.RUNNING)
        ):
            return Completion(False)
        db.execute(
            "UPDATE pages SET state = ?, result_path = ?, error = ?, due = 0, owner = NULL, token = NULL"
            " WHERE job = ? AND seq = ?",
            (outcome.state, outcome.result_path, json.dumps(outcome.error) if outcome.error else None, job_id, seq),
        )
        failed = job["pages_failed"] + (outcome.state == PageState.FAILED)
        ok = job["pages_ok"] + (outcome.state != PageState.FAILED)
        event_id = job["events"] + 1
        db.execute(
            "INSERT INTO events (job, id, data) VALUES (?, ?, ?)",
            (
                job_id,
                event_id,
                json.dumps(
                    {
                        **page_event(seq, page["document"], page["idx"], outcome),
                        "pages_done": ok + failed,
                        "pages_total": job["pages_total"],
                    }
                ),
            ),
        )
        ended = final_status(ok, failed) if ok + failed == job["pages_total"] else ""
        db.execute(
            "UPDATE jobs SET pages_ok = ?, pages_failed = ?, events = ?, status = ?, finished = ?, webhook_due = ?"
            " WHERE id = ?",
            (
                ok,
                failed,
                event_id,
                ended or JobStatus.RUNNING,
                time.time() if ended else 0,
                _webhook_due(job) if ended else None,
                job_id,
            ),
        )
        return Completion(True, ended)

    async def retry_later(self, claim, delay_s):
        return await self._call(self._requeue, claim, time.time() + delay_s, 0)

    async def release(self, claim):
        return await self._call(self._requeue, claim, 0.0, 1)

    def _requeue(self, claim: Claim, due: float, uncount: int) -> bool:
        with self._tx() as db:
            return bool(
                db.execute(
                    "UPDATE pages SET state = ?, due = ?, attempts = attempts - ?, owner = NULL, token = NULL"
                    " WHERE job = ? AND seq = ? AND token = ? AND state = ?",
                    (PageState.QUEUED, due, uncount, claim.job_id, claim.seq, claim.token, PageState.RUNNING),
                ).rowcount
            )

    async def cancel(self, job_id):
        return await self._call(self._cancel, job_id)

    def _cancel(self, job_id: str) -> Job | None:
        with self._tx() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or row["status"] in TERMINAL:
                return _job(row) if row else None
            db.execute(
                "UPDATE jobs SET status = ?, finished = ?, webhook_due = ? WHERE id = ?",
                (JobStatus.CANCELLED, time.time(), _webhook_due(row), job_id),
            )
            db.execute(
                "UPDATE pages SET state = ?, owner = NULL, token = NULL WHERE job = ? AND state IN (?, ?)",
                (PageState.CANCELLED, job_id, PageState.QUEUED, PageState.RUNNING),
            )
            return _job(db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone())

    async def events(self, job_id, after=0):
        return await self._call(self._events, job_id, after)

    def _events(self, job_id: str, after: int) -> list[Event]:
        rows = (
            self._conn()
            .execute("SELECT id, data FROM events WHERE job = ? AND id > ? ORDER BY id", (job_id, after))
            .fetchall()
        )
        return [Event(r["id"], json.loads(r["data"])) for r in rows]

    # webhooks and retention --------------------------------------------------------------------

    async def claim_webhook(self, lease_s):
        return await self._call(self._claim_webhook, lease_s)

    def _claim_webhook(self, lease_s: float) -> Job | None:
        now = time.time()
        with self._tx() as db:
            row = db.execute(
                "SELECT * FROM jobs WHERE webhook_due IS NOT NULL AND webhook_due <= ? ORDER BY webhook_due LIMIT 1",
                (now,),
            ).fetchone()
            if row is None:
                return None
            db.execute("UPDATE jobs SET webhook_due = ? WHERE id = ?", (now + lease_s, row["id"]))
            return _job(row)

    async def webhook_done(self, job_id):
        await self._call(self._write, "UPDATE jobs SET webhook_due = NULL WHERE id = ?", (job_id,))

    async def expired(self, before, limit=100):
        rows = await self._call(
            self._read,
            "SELECT id FROM jobs WHERE finished > 0 AND finished < ? ORDER BY finished LIMIT ?",
            (before, limit),
        )
        return [r["id"] for r in rows]

    async def delete(self, job_id):
        await self._call(self._delete, job_id)

    def _delete(self, job_id: str) -> None:
        with self._tx() as db:
            for table, column in (("events", "job"), ("pages", "job"), ("jobs", "id")):
                db.execute(f"DELETE FROM {table} WHERE {column} = ?", (job_id,))

    # dedup-cache index -------------------------------------------------------------------------

    async def cache_touch(self, key):
        return bool(await self._call(self._write, "UPDATE cache SET used = ? WHERE key = ?", (time.time(), key)))

    async def cache_add(self, key, max_entries):
        return await self._call(self._cache_add, key, max_entries)

    def _cache_add(self, key: str, max_entries: int) -> list[str]:
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO cache (key, used) VALUES (?, ?)", (key, time.time()))
            excess = db.execute("SELECT COUNT(*) FROM cache").fetchone()[0] - max_entries
            if excess <= 0:
                return []
            evicted = [r["key"] for r in db.execute("SELECT key FROM cache ORDER BY used LIMIT ?", (excess,))]
            db.executemany("DELETE FROM cache WHERE key = ?", [(k,) for k in evicted])
            return evicted

    async def backlog(self):
        rows = await self._call(self._read, "SELECT COUNT(*) AS n FROM pages WHERE state IN ('queued', 'running')", ())
        return rows[0]["n"]

    async def open_jobs(self):
        rows = await self._call(
            self._read, "SELECT status, COUNT(*) AS n FROM jobs WHERE finished = 0 GROUP BY status", ()
        )
        return {JobStatus.QUEUED: 0, JobStatus.RUNNING: 0} | {row["status"]: row["n"] for row in rows}

    def _read(self, sql: str, params: tuple) -> list[sqlite3.Row]:
        return self._conn().execute(sql, params).fetchall()

    def _write(self, sql: str, params: tuple) -> int:
        with self._tx() as db:
            return db.execute(sql, params).rowcount

    async def close(self):
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await self._call(shut)
        self._thread.shutdown(wait=True)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` (take the write lock now) ... ``COMMIT``; ``ROLLBACK`` on any error."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _migrate(db: sqlite3.Connection) -> None:
    """Add :data:`ADDED_COLUMNS` missing from an older file, then :data:`LATE_INDEX`; in one
    transaction, so that processes opening the file together do not both add a column."""
    with _transaction(db):
        for table, column, definition in ADDED_COLUMNS:
            if column not in {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
        db.execute(LATE_INDEX)


def _webhook_due(row: sqlite3.Row) -> float | None:
    return time.time() if json.loads(row["spec"]).get("webhook_url") else None


def _job(row: sqlite3.Row) -> Job:
    job = Job.from_json(json.loads(row["spec"]))
    job.status, job.pages_ok, job.pages_failed, job.finished = (
        JobStatus(row["status"]),
        row["pages_ok"],
        row["pages_failed"],
        row["finished"],
    )
    return job
