"""Reading uploads: multipart ``file`` fields (FastAPI ``UploadFile``), or the document itself as
the raw body with its media type (``curl --data-binary @x.tif -H 'Content-Type: image/tiff'``).

FastAPI parses a form body before it solves a route's dependencies, and turns any failure of
that parse into a bare 400. :class:`UploadRoute` parses it first instead, after the API key
check, under the gateway's own limits, so that a refused key is refused before the upload is
read, too many files is a problem naming its setting, a client gone mid-upload is a 499 and a
body above ``server.max_upload_mb`` a 413 (:class:`~ocrserve.api.body_limits.BodyLimitMiddleware`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any, BinaryIO

from fastapi import Request, UploadFile
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException

from ocrserve.api.auth import require_api_key
from ocrserve.config import Config
from ocrserve.errors import BadRequest, UnsupportedMedia
from ocrserve.jobs.intake import Upload
from ocrserve.service import SPOOL_BYTES

#: Media types accepted as a raw request body (besides multipart/form-data): any ``image/*``, and these.
RAW_TYPES = ("image/*", "application/pdf", "application/octet-stream")
#: The raw bodies, as ``openapi_extra`` that adds them beside the generated multipart body.
RAW_BODY_OPENAPI = {
    "requestBody": {
        "content": {media_type: {"schema": {"type": "string", "format": "binary"}} for media_type in RAW_TYPES}
    }
}
#: Form fields besides the files that one request may carry.
MAX_FIELDS = 16
_LIMITS = "_ocrserve_form_limits"

#: A form's file limit: ``config -> (max_files, the limit as a refusal names it)``.
FileLimit = Callable[[Config], tuple[int, str]]


def form_limits(max_files: FileLimit) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator for an endpoint of an :class:`UploadRoute`: parse its form with at most
    ``max_files(config)[0]`` files and :data:`MAX_FIELDS` other fields."""

    def mark(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        setattr(endpoint, _LIMITS, max_files)
        return endpoint

    return mark


class UploadRoute(APIRoute):
    """An ``APIRoute`` that, for endpoints marked with :func:`form_limits`, checks the API key and
    parses a multipart body before FastAPI does (FastAPI then reuses the parsed form)."""

    def get_route_handler(self) -> Callable[[Request], Any]:
        handler = super().get_route_handler()
        max_files: FileLimit | None = getattr(self.endpoint, _LIMITS, None)
        if max_files is None:
            return handler

        async def parse_form_first(request: Request) -> Response:
            await require_api_key(request)
            await read_form(request, *max_files(request.app.state.config))
            return await handler(request)

        return parse_form_first


async def read_form(request: Request, max_files: int, setting: str) -> None:
    """Parse a multipart body (Starlette caches the form on the request); other bodies are left
    unread for :func:`document_file` and :func:`job_uploads`.

    Raises:
        BadRequest: more than ``max_files`` files or :data:`MAX_FIELDS` other fields, or a
            malformed multipart body.
    """
    if not content_type(request).startswith("multipart/form-data"):
        return
    try:
        await request.form(max_files=max_files, max_fields=MAX_FIELDS)
    except (StarletteHTTPException, MultiPartException) as exc:
        detail = getattr(exc, "detail", None) or getattr(exc, "message", str(exc))
        if detail.startswith("Too many"):  # Starlette's words for max_files / max_fields
            detail += f" (at most {setting} and {MAX_FIELDS} other fields)"
        raise BadRequest(f"malformed multipart body: {detail}") from None


def raw_type(content_type: str) -> bool:
    """Whether a ``Content-Type`` (parameters such as ``; charset`` ignored) is one of :data:`RAW_TYPES`."""
    media_type = content_type.split(";", 1)[0].strip()
    return media_type.startswith("image/") or media_type in RAW_TYPES


def content_type(request: Request) -> str:
    """The request's ``Content-Type``, lower case."""
    return request.headers.get("content-type", "").lower()


def _raw_body_type(request: Request) -> None:
    """Accept a raw body's media type (or none at all).

    Raises:
        BadRequest: multipart without a ``file`` field.
        UnsupportedMedia: neither multipart nor one of :data:`RAW_TYPES`.
    """
    kind = content_type(request)
    if kind.startswith("multipart/form-data"):
        raise BadRequest("multipart field 'file' is required")
    if kind and not raw_type(kind):
        raise UnsupportedMedia(
            f"Content-Type {kind!r}: send multipart/form-data with a 'file' field, or an image/*, "
            "application/pdf or application/octet-stream body"
        )


async def document_file(request: Request, file: UploadFile | None) -> BinaryIO:
    """The one document of a synchronous request as a binary file at its start: its ``file``
    (spooled by the form parser), else the raw body, spooled as it arrives (empty when there is
    none). Memory holds at most :data:`~ocrserve.service.SPOOL_BYTES` of it; the rest is on disk.
    The caller closes it.

    Raises:
        BadRequest, UnsupportedMedia: see :func:`_raw_body_type`.
    """
    if file is not None:
        return file.file
    _raw_body_type(request)
    return (await _spool_body(request)).file


async def _spool_body(request: Request) -> UploadFile:
    """The raw body in a spooled temporary file, at its start."""
    spool = UploadFile(tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES), size=0)  # noqa: SIM115 (outlives this call)
    try:
        async for chunk in request.stream():
            await spool.write(chunk)
        await spool.seek(0)
    except BaseException:
        await spool.close()
        raise
    return spool


async def job_uploads(request: Request, files: list[UploadFile] | None, filename: str | None) -> list[Upload]:
    """The documents of a job: its ``file`` fields (spooled by the form parser), else the raw
    body, spooled to a temporary file as it arrives (none when it is empty). The caller closes
    the files once the intake has staged them.

    Raises:
        BadRequest, UnsupportedMedia: see :func:`_raw_body_type`.
    """
    if files:
        return [Upload(f.filename or f"document-{n}", f.file) for n, f in enumerate(files)]
    _raw_body_type(request)
    spool = await _spool_body(request)
    if not spool.size:
        await spool.close()
        return []
    return [Upload(filename or "document", spool.file)]
