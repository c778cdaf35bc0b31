"""The gateway's log: request ids, probes kept out of the access log, text or JSON lines.

- **Request ids**: each request has one (:func:`accept_request_id`: the client's ``X-Request-ID``
  when it is short and plain, else a new uuid4 in hex). It is held in a context variable while
  the request runs (:func:`request_scope`), kept with the jobs it creates, and set again while the
  job worker runs their pages, so :class:`RequestIdFilter` adds it to every log record made
  meanwhile as ``request_id`` (``-`` in text, ``null`` in JSON where there is none).
- **Probes**: :class:`AccessFilter` drops uvicorn's access lines of ``/healthz``, ``/readyz`` and
  ``/metrics`` unless ``server.log_probes`` is on, and adds the request's fields (``method``,
  ``path``, ``status``, ``client``) to the lines it keeps, for JSON.
- **Format**: :func:`logging_config` is the :func:`logging.config.dictConfig` configuration of
  ocrserve's and uvicorn's loggers for ``server.log_format``: ``text`` lines, or one JSON object a
  line (python-json-logger).
"""

from __future__ import annotations

import contextlib
import logging
import re
import uuid
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pythonjsonlogger.core import RESERVED_ATTRS

#: The header a request id comes in and goes back in.
REQUEST_ID_HEADER = "X-Request-ID"
#: Longest request id taken from a client, characters.
MAX_REQUEST_ID = 128
#: What a client's request id may hold: letters, digits and ``-_.:~+/=`` (no spaces, quotes or
#: control characters that could forge or break a log line).
_REQUEST_ID = re.compile(rf"[A-Za-z0-9._:~+/=-]{{1,{MAX_REQUEST_ID}}}")
#: The paths of the probes that :class:`AccessFilter` keeps out of the access log.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
#: Where there is no request id: in text lines.
NO_REQUEST_ID = "-"

_request_id: ContextVar[str] = ContextVar("ocrserve_request_id", default="")


def new_request_id() -> str:
    """A fresh request id: a uuid4 in 32 hex digits."""
    return uuid.uuid4().hex


def accept_request_id(sent: str | None) -> str:
    """The id of a request that sent ``sent`` as its ``X-Request-ID``: that value when it is 1 to
    :data:`MAX_REQUEST_ID` characters of letters, digits and ``-_.:~+/=``, else a new one."""
    if sent and _REQUEST_ID.fullmatch(sent):
        return sent
    return new_request_id()


def current_request_id() -> str:
    """The request id of the request (or job page) this code runs for; ``""`` outside one."""
    return _request_id.get()


@contextlib.contextmanager
def request_scope(request_id: str) -> Iterator[str]:
    """Run the block for the request ``request_id``: log records made in it (and in tasks it starts)
    carry that id."""
    token = _request_id.set(request_id)
    try:
        yield request_id
    finally:
        _request_id.reset(token)


def set_request_id(request_id: str) -> None:
    """Make ``request_id`` the current one for the rest of this task (a job page's, in the worker
    task that runs it)."""
    _request_id.set(request_id)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` to every record: the one passed in ``extra``, else the current request's
    (:func:`current_request_id`), else ``missing``.

    Args:
        missing: the value where there is none (``-`` for text lines, None for JSON).
    """

    def __init__(self, missing: str | None = NO_REQUEST_ID):
        super().__init__()
        self.missing = missing

    def filter(self, record: logging.LogRecord) -> bool:
        """Set ``record.request_id``; never drops a record."""
        if not getattr(record, "request_id", None):
            record.request_id = current_request_id() or self.missing
        return True


class AccessFilter(logging.Filter):
    """On ``uvicorn.access``: drops the lines of the probes (:data:`PROBE_PATHS`) unless
    ``log_probes``, and gives the others ``method``, ``path``, ``status`` and ``client`` fields.

    uvicorn logs ``'%s - "%s %s HTTP/%s" %d'`` with the client's address, the method, the path with
    its query, the HTTP version and the status as the record's arguments.
    """

    def __init__(self, log_probes: bool = False):
        super().__init__()
        self.log_probes = log_probes

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a probe's line (unless ``log_probes``); True for any other record."""
        args = record.args
        if not isinstance(args, tuple) or len(args) != 5:
            return True
        client, method, full_path, _, status = args
        path = str(full_path).partition("?")[0]
        if not self.log_probes and path in PROBE_PATHS:
            return False
        record.client, record.method, record.path, record.status = client, method, path, status
        return True


#: Text lines: time, level, logger, request id, message.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"
#: The fields every JSON line has besides ``time`` (ISO 8601, UTC); a record's extra attributes
#: are added after them.
JSON_FIELDS = ("levelname", "name", "request_id", "message")
#: Record attributes that JSON lines leave out: logging's own, and the ANSI-coloured copy of the
#: message that uvicorn attaches to its records.
JSON_RESERVED = (*RESERVED_ATTRS, "color_message", "taskName")


def logging_config(log_level: str = "info", log_format: str = "text", log_probes: bool = False) -> dict[str, Any]:
    """The :func:`logging.config.dictConfig` configuration of the gateway's log (uvicorn's
    ``log_config``): ocrserve's, uvicorn's and its access log's lines on stderr, as text or JSON,
    each with its ``request_id``; other libraries' warnings through the same handler.

    Args:
        log_level: ``server.log_level`` (uvicorn's names: ``critical`` ... ``debug``, ``trace``).
        log_format: ``text`` or ``json``.
        log_probes: keep the probes' access lines (``server.log_probes``).
    """
    level = "DEBUG" if log_level == "trace" else log_level.upper()
    if log_format == "json":
        formatter = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": list(JSON_FIELDS),
            "rename_fields": {"levelname": "level", "name": "logger"},
            "timestamp": "time",
            "reserved_attrs": list(JSON_RESERVED),
        }
        missing = None
    else:
        formatter = {"format": TEXT_FORMAT}
        missing = NO_REQUEST_ID
    handler = {"class": "logging.StreamHandler", "stream": "ext://sys.stderr", "formatter": "line"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"line": formatter},
        "filters": {
            "request_id": {"()": RequestIdFilter, "missing": missing},
            "access": {"()": AccessFilter, "log_probes": log_probes},
        },
        "handlers": {"default": {**handler, "filters": ["request_id"]}},
        "loggers": {
            "ocrserve": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["default"], "level": level, "propagate": False, "filters": ["access"]},
        },
        "root": {"handlers": ["default"], "level": "WARNING"},
    }


def redact_url(url: str) -> str:
    """``url`` without the password of its user part (``redis://:secret@host`` -> ``redis://:***@host``)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
