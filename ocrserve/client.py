"""HTTP client of the gateway, used by ``ocrserve ocr`` and the benchmarks."""

from __future__ import annotations

import mimetypes
from pathlib import Path

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

#: File suffixes ``ocrserve ocr DIR`` picks up.
DOCUMENT_SUFFIXES = {".jpg", ".jpeg", ".png", ".tif", ".tiff", ".webp", ".bmp", ".gif", ".pdf"}
#: Statuses worth retrying: the server is busy or restarting.
RETRY_STATUSES = {429, 502, 503}


class RequestFailed(Exception):
    """The gateway answered with an error; ``problem`` holds its problem-details body."""

    def __init__(self, status: int, problem: dict):
        super().__init__(f"{status} {problem.get('title', '')}: {problem.get('detail', '')}")
        self.status = status
        self.problem = problem


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) or (
        isinstance(exc, RequestFailed) and exc.status in RETRY_STATUSES
    )


def collect_documents(paths: list[Path]) -> list[Path]:
    """Files named directly, plus documents found recursively under directories, sorted.

    Raises:
        FileNotFoundError: a named path does not exist.
    """
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.suffix.lower() in DOCUMENT_SUFFIXES and p.is_file()))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or directory: {path}")
    return found


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

    async def __aenter__(self) -> "OcrClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self._http.aclose()

    async def ocr(self, path: Path, *, fmt: str = "json", pages: str | None = None) -> dict | str:
        """OCR one file: the result dict for ``json``, else the rendered text.

        Raises:
            RequestFailed: the gateway refused or failed the document (after retries).
        """
        data = {"format": fmt} | ({"pages": pages} if pages else {})
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retryable), stop=stop_after_attempt(self.attempts),
            wait=wait_exponential(multiplier=0.5, max=10), reraise=True,
        ):
            with attempt:
                with path.open("rb") as fh:
                    response = await self._http.post("/v1/ocr", data=data, files={"file": (path.name, fh, media_type)})
                if response.status_code >= 400:
                    raise RequestFailed(response.status_code, _problem_body(response))
        return response.json() if fmt == "json" else response.text


def _problem_body(response: httpx.Response) -> dict:
    try:
        body = response.json()
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"title": response.reason_phrase, "detail": response.text[:200]}
