"""Property-based fuzzing shared by the short CI runs (tests/test_fuzz_*.py) and the long run
(scripts/fuzz.py): hypothesis strategies for broken documents and schemathesis cases for the API,
and the checks every outcome must pass.

Preprocessor: random bytes, truncations and header mutations of the samples in tests/data (and a
few containers built from them: PDF, WebP, GIF, BMP) go through
:func:`~ocrserve.preprocess.inspect_document` and :func:`~ocrserve.preprocess.decode_pages`;
every outcome must be a page, a :class:`~ocrserve.preprocess.DecodeFailure` or a 4xx
:class:`~ocrserve.errors.ProblemError`, never another exception, within :data:`DOCUMENT_TIME_LIMIT_S`.

API: requests drawn from the gateway's own OpenAPI schema (schemathesis), valid and invalid, must
get no 5xx (but the 503 or 504 a request's own ``timeout`` asks for), no traceback or server file path in
the body, and an answer within :data:`REQUEST_TIME_LIMIT_S`.
"""

from __future__ import annotations

import functools
import re
import sys
import sysconfig
import time
from dataclasses import dataclass

import schemathesis
from hypothesis import strategies as st
from schemathesis import Case, GenerationMode

from ocrserve.bench.harness import REPO
from ocrserve.config import PreprocessConfig
from ocrserve.errors import ProblemError
from ocrserve.pages import Page
from ocrserve.preprocess import DecodeFailure, decode_pages, inspect_document
from tests import samples
from tests.conftest import DATA

#: Longest one document may take through inspection and decoding of every page, seconds.
DOCUMENT_TIME_LIMIT_S = 10.0
#: Longest the gateway may take to answer one fuzzed request, seconds.
REQUEST_TIME_LIMIT_S = 30.0
#: Bytes at the start of a sample that header mutations touch: signatures, image headers, IFD
#: offsets and the PDF header all lie there.
HEADER_BYTES = 512
#: Signatures that get random bytes past the format sniffing into each decoder.
MAGICS = (
    b"\xff\xd8\xff",
    b"\x89PNG\r\n\x1a\n",
    b"II*\x00",
    b"MM\x00*",
    b"RIFF\x00\x00\x00\x00WEBPVP8 ",
    b"GIF89a",
    b"BM",
    b"%PDF-1.7\n",
)


@functools.cache
def sample_documents() -> dict[str, bytes]:
    """The real samples of tests/data (PNG, JPEG, TIFF) and containers the preprocessor also reads,
    built from phototest (PDF, WebP, GIF, BMP), by name."""
    documents = {
        path.name: path.read_bytes() for path in sorted(DATA.iterdir()) if path.suffix in {".png", ".jpg", ".tif"}
    }
    page = samples.phototest()
    documents |= {
        "rotated.pdf": samples.rotated_pdf(),
        "phototest.webp": samples.encode(page, "WEBP"),
        "phototest.gif": samples.encode(page, "GIF"),
        "phototest.bmp": samples.encode(page, "BMP"),
        "cmyk.jpg": samples.cmyk_jpeg(),
    }
    return documents


@dataclass(frozen=True)
class Document:
    """A fuzzed document, described so that a failure names its exact bytes compactly.

    Attributes:
        sample: the sample it derives from (:func:`sample_documents`), or None for ``raw`` alone.
        raw: random bytes (appended to ``sample``'s bytes when there is one; usually empty then).
        cut: length the sample is truncated to (None: whole).
        edits: ``(offset, value)`` bytes written over the sample, in order.
    """

    sample: str | None = None
    raw: bytes = b""
    cut: int | None = None
    edits: tuple[tuple[int, int], ...] = ()

    @property
    def data(self) -> bytes:
        """The document's bytes."""
        data = bytearray(sample_documents()[self.sample] if self.sample else b"")
        for offset, value in self.edits:
            data[offset] = value
        return bytes(data[: self.cut]) + self.raw


def random_documents() -> st.SearchStrategy[Document]:
    """Random bytes, bare or behind one of the :data:`MAGICS`."""
    noise = st.binary(max_size=4096)
    return st.one_of(
        noise.map(lambda raw: Document(raw=raw)),
        st.tuples(st.sampled_from(MAGICS), noise).map(lambda parts: Document(raw=b"".join(parts))),
    )


def truncated_documents() -> st.SearchStrategy[Document]:
    """A sample cut at a random length."""
    return st.sampled_from(sorted(sample_documents())).flatmap(
        lambda name: st.integers(0, len(sample_documents()[name])).map(lambda cut: Document(name, cut=cut))
    )


def mutated_documents() -> st.SearchStrategy[Document]:
    """A sample with 1 to 8 of its first :data:`HEADER_BYTES` bytes flipped in one bit or replaced."""

    def mutate(name: str) -> st.SearchStrategy[Document]:
        data = sample_documents()[name]
        offset = st.integers(0, min(len(data), HEADER_BYTES) - 1)
        flip = st.tuples(offset, st.integers(0, 7)).map(lambda ob: (ob[0], data[ob[0]] ^ (1 << ob[1])))
        replace = st.tuples(offset, st.integers(0, 255))
        return st.lists(flip | replace, min_size=1, max_size=8).map(lambda edits: Document(name, edits=tuple(edits)))

    return st.sampled_from(sorted(sample_documents())).flatmap(mutate)


def documents() -> st.SearchStrategy[Document]:
    """Every kind of broken document: random, truncated, header-mutated."""
    return st.one_of(random_documents(), truncated_documents(), mutated_documents())


def check_document(document: Document, cfg: PreprocessConfig) -> str:
    """Inspect and decode ``document`` as the gateway does and check the outcome.

    Returns:
        the outcome, for statistics: ``"pages"`` (every page decoded), ``"partial"`` (some pages
        failed alone) or the refusal's ``"<status> <slug>"``.

    Raises:
        AssertionError: a problem that is not 4xx, a page that is not RGB within the pixel budget,
            or more than :data:`DOCUMENT_TIME_LIMIT_S`.
        Exception: whatever else the preprocessor raised (the finding).
    """
    data = document.data
    started = time.monotonic()
    try:
        info = inspect_document(data, cfg)
        indices = info.select(None, cfg)
        outcomes = decode_pages(data, info, indices, cfg)
    except ProblemError as problem:
        _check_problem(problem)
        outcome = f"{problem.status} {problem.slug}"
    else:
        assert len(outcomes) == len(indices), f"{len(outcomes)} outcomes for {len(indices)} pages"
        for item in outcomes:
            _check_page_outcome(item, cfg)
        outcome = "partial" if any(isinstance(item, DecodeFailure) for item in outcomes) else "pages"
    elapsed = time.monotonic() - started
    assert elapsed < DOCUMENT_TIME_LIMIT_S, f"{elapsed:.1f} s for one document (limit {DOCUMENT_TIME_LIMIT_S:g} s)"
    return outcome


def _check_problem(problem: ProblemError) -> None:
    assert 400 <= problem.status < 500, f"{type(problem).__name__} {problem.status}: {problem.detail}"


def _check_page_outcome(item: Page | DecodeFailure, cfg: PreprocessConfig) -> None:
    if isinstance(item, DecodeFailure):
        _check_problem(item.problem)
        return
    assert isinstance(item, Page), f"not a page nor a failure: {item!r}"
    height, width, channels = item.image.shape
    assert item.image.dtype.name == "uint8" and channels == 3, f"page {item.index}: {item.image.dtype} {channels}"
    assert width % cfg.factor == 0 and height % cfg.factor == 0, f"page {item.index}: {width} x {height}"
    assert width * height <= cfg.max_pixels, f"page {item.index}: {width} x {height} above max_pixels"


#: Text that shows a server-side traceback in a response body.
_TRACEBACK = re.compile(r'Traceback \(most recent call last\)|File "[^"]+", line \d+')
#: Server paths a response body must not reveal: the checkout and the installed packages.
SERVER_PATHS = tuple({str(REPO), sys.prefix, sysconfig.get_paths()["purelib"]})


def api_cases(schema: schemathesis.BaseSchema) -> st.SearchStrategy[Case]:
    """Requests to every operation of ``schema``, valid and invalid by it."""
    return st.one_of(
        [
            result.ok().as_strategy(mode)
            for result in schema.get_all_operations()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        ]
    )


def check_call(case: Case, base_url: str) -> int:
    """Send ``case`` to the gateway at ``base_url`` and check the answer.

    Returns:
        the response's status code.

    Raises:
        AssertionError: a 5xx, a traceback or server path in the body, or no answer within
            :data:`REQUEST_TIME_LIMIT_S` (``requests`` raises its timeout).
    """
    started = time.monotonic()
    response = case.call(base_url=base_url, timeout=REQUEST_TIME_LIMIT_S)
    elapsed = time.monotonic() - started
    body = response.content.decode("utf-8", "replace")
    what = f"{case.method} {case.formatted_path} -> {response.status_code}"
    assert response.status_code < 500 or _missed_its_timeout(case, response), f"{what}: {body[:1000]}"
    assert not _TRACEBACK.search(body), f"{what}: traceback in the body: {body[:1000]}"
    leaked = [path for path in SERVER_PATHS if path in body]
    assert not leaked, f"{what}: server path {leaked[0]} in the body: {body[:1000]}"
    assert elapsed < REQUEST_TIME_LIMIT_S, f"{what}: {elapsed:.1f} s"
    return response.status_code


def _missed_its_timeout(case: Case, response) -> bool:
    """A deadline problem for a request that set its own ``timeout``: the documented answers (a
    fuzzed timeout of 0.06 s is refused at admission, 503 ``deadline-unmeetable``, or passes
    before any page is done, 504), not a server error."""
    asked = "timeout" in (case.query or {}) or (isinstance(case.body, dict) and "timeout" in case.body)
    return asked and response.status_code in (503, 504) and b"/problems/deadline" in response.content


def load_schema(base_url: str) -> schemathesis.BaseSchema:
    """The gateway's OpenAPI schema, from ``{base_url}/openapi.json``."""
    return schemathesis.openapi.from_url(f"{base_url}/openapi.json")
