"""HTTP client of the gateway, used by ``ocrserve ocr`` and the benchmarks."""

from __future__ import annotations

import asyncio
import hashlib
import json
import mimetypes
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse
from tenacity import retry_if_exception

from ocrserve import backoff

#: Statuses worth retrying: the server is busy or restarting.
RETRY_STATUSES = {429, 502, 503}
#: Back-off of a retried request, seconds: first wait, cap (see :mod:`ocrserve.backoff`).
REQUEST_BACKOFF_S = (0.5, 10.0)
#: Back-off of a job's event stream reconnecting after consecutive failures, seconds: first wait, cap.
STREAM_BACKOFF_S = (1.0, 10.0)


class RequestFailed(Exception):
    """The gateway answered with an error; ``problem`` holds its problem-details body and
    ``retry_after`` its ``Retry-After`` in seconds (None without one, or with an HTTP date)."""

    def __init__(self, status: int, problem: dict, retry_after: float | None = None):
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem
        self.retry_after = retry_after

    @property
    def engine_down(self) -> bool:
        """A 503 because the gateway has no engine to run pages (loading, or every replica down):
        every document would get it until the engine is back."""
        return self.status == 503 and str(self.problem.get("type", "")).endswith(
            ("/engine-down", "/engine-unavailable")
        )


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) or (isinstance(exc, RequestFailed) and exc.status in RETRY_STATUSES)


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def idempotency_key(path: Path, **params) -> str:
    """A job's ``Idempotency-Key`` for a file: its name, sha256 and the parameters, so that
    submitting the same file with the same parameters again finds the earlier job. The name counts
    because the gateway's request does (a result carries its document's name): two copies of one
    file under different names are two jobs, not a reused key (409)."""
    canonical = json.dumps({k: v for k, v in params.items() if v is not None}, sort_keys=True)
    return "ocrserve-" + hashlib.sha256(f"{path.name}:{file_sha256(path)}:{canonical}".encode()).hexdigest()


class OcrClient:
    """Async client of ``POST /v1/ocr``.

    Args:
        url: the gateway's base URL, e.g. ``http://127.0.0.1:8000``.
        api_key: sent as ``Authorization: Bearer``.
        timeout: seconds to wait for one document.
        attempts: tries on 429/502/503 and connection errors, with exponential backoff.
    """

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 600.0, attempts: int = 5):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self.attempts = attempts

    async def __aenter__(self) -> OcrClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def answers(self, timeout: float = 5.0) -> bool:
        """Whether the gateway answers ``GET /healthz`` at all (any status) within ``timeout``
        seconds: False when the connection is refused, reset or times out."""
        try:
            await self._http.get("/healthz", timeout=timeout)
        except httpx.TransportError:
            return False
        return True

    async def _retrying(self, send: Callable[[], Awaitable[httpx.Response]]) -> httpx.Response:
        """``send()`` until it answers below 400, retrying 429/502/503 and connection errors (after
        the back-off, or the answer's ``Retry-After`` where longer, up to the back-off's cap).

        Raises:
            RequestFailed: an error status that is not retried, or the last one.
        """
        retry = retry_if_exception(_retryable)
        async for attempt in backoff.retrying(self.attempts, *REQUEST_BACKOFF_S, retry, _retry_after):
            with attempt:
                response = await send()
                if response.status_code >= 400:
                    raise RequestFailed(response.status_code, _problem_body(response), _seconds(response))
        return response

    async def _post_file(self, url: str, path: Path, data: dict, headers: dict | None = None) -> httpx.Response:
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"

        async def send() -> httpx.Response:
            with path.open("rb") as fh:
                return await self._http.post(
                    url, data=data, files={"file": (path.name, fh, media_type)}, headers=headers
                )

        return await self._retrying(send)

    async def ocr(self, path: Path, *, fmt: str = "json", pages: str | None = None) -> dict | str:
        """OCR one file: the result dict for ``json``, else the rendered text.

        Raises:
            RequestFailed: the gateway refused or failed the document (after retries).
        """
        data = {"format": fmt} | ({"pages": pages} if pages else {})
        response = await self._post_file("/v1/ocr", path, data)
        return response.json() if fmt == "json" else response.text

    async def submit_job(
        self, path: Path, *, pages: str | None = None, priority: int | None = None, key: str | None = None
    ) -> dict:
        """Submit one file as a job (``POST /v1/jobs``); returns the job's status (``id``,
        ``pages_total``, ...). With the same ``key`` (an ``Idempotency-Key``) and request, the
        earlier job is returned instead of a new one.

        Raises:
            RequestFailed: the gateway refused the file (after retries).
        """
        data = {k: str(v) for k, v in (("pages", pages), ("priority", priority)) if v is not None}
        headers = {"Idempotency-Key": key} if key else None
        return (await self._post_file("/v1/jobs", path, data, headers)).json()

    async def job_events(self, job_id: str) -> AsyncIterator[tuple[str, dict]]:
        """The job's Server-Sent Events as ``(event, data)``: ``page`` per finished page, then
        ``done`` (data: the job's status), after which the iteration ends. A dropped connection is
        resumed with ``Last-Event-ID`` (on any gateway sharing the job store).

        Raises:
            RequestFailed: the job is unknown, or the stream failed ``attempts`` times in a row.
        """
        last_id, failures = "", 0
        while True:
            headers = {"Last-Event-ID": last_id} if last_id else {}
            try:
                async with aconnect_sse(
                    self._http,
                    "GET",
                    f"/v1/jobs/{job_id}/events",
                    headers=headers,
                    timeout=httpx.Timeout(30.0, read=None),
                ) as source:
                    response = source.response
                    if response.status_code >= 400:
                        await response.aread()
                        raise RequestFailed(response.status_code, _problem_body(response))
                    async for sse in source.aiter_sse():
                        if not sse.data:  # a keep-alive after an event with an id
                            continue
                        failures = 0
                        last_id = sse.id or last_id
                        yield sse.event, sse.json()
                        if sse.event == "done":
                            return
            except (httpx.TransportError, RequestFailed) as exc:  # httpx_sse.SSEError is a TransportError
                failures += 1
                if failures >= self.attempts or not _retryable(exc):
                    raise
                await asyncio.sleep(backoff.delay(failures, *STREAM_BACKOFF_S))

    async def job_result(self, job_id: str, *, fmt: str = "json") -> dict | str:
        """A finished job's result: the result dict for ``json``, else the rendered text.

        Raises:
            RequestFailed: unknown job, or not finished (409).
        """
        response = await self._retrying(lambda: self._http.get(f"/v1/jobs/{job_id}/result", params={"format": fmt}))
        return response.json() if fmt == "json" else response.text


def _retry_after(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, RequestFailed) else None


def _seconds(response: httpx.Response) -> float | None:
    """``Retry-After`` as seconds (RFC 9110 section 10.2.3's delay-seconds form), else None."""
    value = response.headers.get("retry-after", "")
    return float(value) if value.isdigit() else None


def _problem_body(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"title": response.reason_phrase, "detail": response.text[:200]}
