"""What clients read about a job: its status view, and its result in the sync result's shape."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

from ocrserve.errors import PROBLEM_BASE
from ocrserve.formats import assemble_result
from ocrserve.pages import PageResult
from ocrserve.scheduling import BULK
from ocrserve.store.base import JobStore
from ocrserve.store.files import DataDir
from ocrserve.store.job_records import Job, PageRecord, PageState

#: The ``error`` of a page that never ran because its job was cancelled.
CANCELLED_PAGE = {
    "type": PROBLEM_BASE + "cancelled",
    "title": "Cancelled",
    "status": 409,
    "detail": "the job was cancelled before this page ran",
}


def _iso(seconds: float) -> str | None:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds") if seconds else None


def links(job_id: str) -> dict:
    """Where the job's status, result and events are."""
    base = f"/v1/jobs/{job_id}"
    return {"self": base, "result": base + "/result", "events": base + "/events"}


def status_view(job: Job, pages: list[PageRecord] | None = None) -> dict:
    """``GET /v1/jobs/{id}``: status, counts (``pages_done`` counts failed pages too), documents, the
    error of each failed page (from ``pages``; empty without them) and links."""
    return {
        "id": job.id,
        "status": job.status,
        "priority": job.priority,
        "created_at": _iso(job.created),
        "finished_at": _iso(job.finished),
        "pages_total": job.pages_total,
        "pages_done": job.pages_done,
        "pages_failed": job.pages_failed,
        "documents": [{"name": d.name, "sha256": d.sha256, "pages": len(d.indices)} for d in job.documents],
        "errors": [
            {"page": p.seq, "document": p.document, "index": p.index, "error": p.error}
            for p in pages or ()
            if p.state == PageState.FAILED
        ],
        "links": links(job.id),
    }


async def job_status(store: JobStore, job: Job) -> dict:
    """:func:`status_view` of ``job``, reading its pages only when some failed."""
    return status_view(job, await store.pages(job.id) if job.pages_failed else None)


async def job_result(store: JobStore, data: DataDir, job: Job) -> dict:
    """The result of a job: the sync result (lane ``bulk``, ``id`` = the job's) over every page of
    every document in order, each page with its ``document`` number, plus ``documents`` (name,
    sha256 and the positions of its pages in ``pages``). Unfinished pages carry an ``error``."""
    records = await store.pages(job.id)
    pages = await asyncio.to_thread(_load_pages, data, records)
    seconds = (job.finished or time.time()) - job.created
    result = assemble_result(pages, job.model, BULK, seconds, job.id)
    result["documents"] = [
        {"name": d.name, "sha256": d.sha256, "pages": [r.seq for r in records if r.document == n]}
        for n, d in enumerate(job.documents)
    ]
    return result


def _load_pages(data: DataDir, records: list[PageRecord]) -> list[dict]:
    pages = []
    for record in records:
        if record.state == PageState.DONE:
            page = data.read_json(record.result_path)
        else:
            error = record.error if record.state == PageState.FAILED else CANCELLED_PAGE
            page = PageResult(index=record.index, width=0, height=0, text="", error=error).to_dict()
        pages.append({**page, "document": record.document})
    return pages
