"""The size-normalizing front of every engine: decode documents, guard limits, fit a pixel budget.

A document (JPEG, PNG, TIFF, WebP, BMP, GIF, PDF) becomes a list of :class:`~ocrserve.pages.Page`:
RGB arrays whose sides are multiples of the model's ``factor`` and whose area lies within
``[min_pixels, max_pixels]`` (the rule of Qwen2-VL's ``smart_resize``). Limits are checked before
any pixel is decoded: bytes, pages per document, and pixels per page (decompression bombs), each a
413 problem naming the limit (pixels and decoded bytes count bit depth and channels); an unknown
or undecodable file is a 415 problem, and so is one whose image data ends before the image does
(:mod:`.integrity`: never filled in).

Decoding is CPU-bound and PDFium is not thread-safe, so :class:`Preprocessor` runs it in decoding
processes (:mod:`ocrserve.preprocess.pool`), a few pages per task, off the event loop; each is
bounded in memory and time, so a poison document costs one 422 and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pypdfium2 as pdfium
from PIL import Image, ImageCms, ImageMode, ImageOps, ImageSequence, UnidentifiedImageError

from ocrserve.config import PreprocessConfig
from ocrserve.errors import BadRequest, PayloadTooLarge, PoisonDocument, ProblemError, UnsupportedMedia
from ocrserve.pages import Page
from ocrserve.preprocess.blank import is_blank
from ocrserve.preprocess.geometry import smart_resize, visual_tokens
from ocrserve.preprocess.integrity import check_image_data, check_tiff_directory, ends_early
from ocrserve.preprocess.pool import DecodePool
from ocrserve.preprocess.textlayer import read_text_layer
from ocrserve.priority import BackgroundPriority, opencv_on_calling_threads
from ocrserve.work import is_urgent

# We check pixel counts ourselves (max_page_pixels) and answer 413; Pillow's own bomb guard
# would raise a generic error at twice its default of 89.5 Mpx.
Image.MAX_IMAGE_PIXELS = None

log = logging.getLogger(__name__)
#: The size of a page's preview (:func:`preview_pages`), pixels, and the most a page's line units
#: are counted on (:mod:`.lines`: the page is brought down to them first; a letter page's small
#: text stays about 10 px tall).
PREVIEW_PIXELS = 1_000_000
#: Pages of a request previewed before its admission (:func:`preview_pages`); the others are priced
#: at the line units per pixel of these.
PREVIEW_PAGES = 4
#: An image frame of more pixels is not decoded for a preview (a JPEG is, at 1/8 scale or less,
#: whatever its size): decoding such a frame twice costs more than a guess at its line units. 300-dpi
#: letter scans of 8.4-10.5 Mpx decoded in 16-54 ms on the development machine.
PREVIEW_DECODE_PIXELS = 12_000_000
#: A PDF page's preview is rendered at this many times the side of an image's (at most its
#: normalized size), and :func:`~ocrserve.preprocess.lines.line_units` brings it down as it does a
#: decoded page: PDFium's anti-aliasing at a megapixel merges small characters that a larger render
#: keeps apart (counted as blobs of ink, ``cardinal.pdf``'s first page held 2,527 rendered at a
#: megapixel against 3,017 on the decoded page, and 3,105 rendered at twice the side).
PDF_PREVIEW_OVERSAMPLE = 2
#: Image formats Pillow may open; anything else is a 415 even if Pillow could read it.
IMAGE_FORMATS = {"JPEG", "PNG", "TIFF", "WEBP", "BMP", "GIF", "MPO"}
#: TIFF tag NewSubfileType (254); bit 0 set marks a reduced-resolution copy of another image
#: (TIFF 6.0 specification, section 8), as pyramidal TIFFs store their overview levels.
TIFF_NEW_SUBFILE_TYPE = 254
#: Pages decoded per process-pool task: amortizes the cost of sending the document bytes.
PAGES_PER_TASK = 4
#: Longest side over shortest side a page may have: the limit Qwen2-VL's ``smart_resize`` enforces.
MAX_ASPECT_RATIO = 200
#: PDF user-space units per inch (ISO 32000-1, 8.3.2.3).
PDF_POINTS_PER_INCH = 72.0

Source = bytes | str | Path


@dataclass(frozen=True)
class DocumentInfo:
    """What :func:`inspect_document` learns without decoding pixels.

    Attributes:
        kind: ``"pdf"`` or ``"image"``.
        page_count: pages (PDF pages, or image frames that are not reduced-resolution copies).
        sizes: each page's ``(width, height)`` in client pixels (images: as stored, before EXIF
            orientation; PDFs: at ``pdf_dpi``).
        frames: for images, the frame number of each page (``len(frames) == page_count``).
    """

    kind: str
    page_count: int
    sizes: tuple[tuple[int, int], ...]
    frames: tuple[int, ...] = ()

    def normalized_sizes(self, indices: Sequence[int], cfg: PreprocessConfig) -> list[tuple[int, int]]:
        """``(width, height)`` the pages ``indices`` will have after normalization (:func:`target_size`)."""
        return [target_size(*self.sizes[i], cfg) for i in indices]

    def normalized_pixels(self, indices: Sequence[int], cfg: PreprocessConfig) -> int:
        """Pixels the pages ``indices`` will have after normalization, in all."""
        return sum(math.prod(size) for size in self.normalized_sizes(indices, cfg))

    def visual_tokens(self, indices: Sequence[int], cfg: PreprocessConfig) -> int:
        """Visual tokens of the pages ``indices`` after normalization, in all (:func:`visual_tokens`
        of each page's target size): the request's cost before any page is decoded."""
        return sum(visual_tokens(h, w, cfg.factor) for w, h in self.normalized_sizes(indices, cfg))

    def select(self, pages: str | None, cfg: PreprocessConfig) -> list[int]:
        """The 0-based indices of the requested ``pages`` (``"1-3,5"``; None: all), checked before
        any decoding, the same way for a synchronous request and a job. A request whose every
        selected page is above ``cfg.max_page_pixels`` is refused; where only some are, those pages
        fail alone when decoded.

        Raises:
            BadRequest: malformed ranges, or a page beyond the document.
            PayloadTooLarge: more than ``cfg.max_pages`` pages selected; 413 naming the first
                too-large page and the limit; or a page whose aspect ratio no pixel budget can hold
                (:func:`target_size`).
        """
        indices = parse_page_ranges(pages, self.page_count)
        if len(indices) > cfg.max_pages:
            raise PayloadTooLarge(
                f"{len(indices)} pages selected of the document's {self.page_count}; the limit is "
                f"preprocess.max_pages={cfg.max_pages} per request: select fewer with pages= (e.g. "
                f"pages=1-{cfg.max_pages})",
                slug="too-many-pages",
            )
        if indices and all(math.prod(self.sizes[i]) > cfg.max_page_pixels for i in indices):
            _check_pixels(*self.sizes[indices[0]], cfg, indices[0])
        for i in indices:
            target_size(*self.sizes[i], cfg)
        return indices


@dataclass(frozen=True)
class DecodeFailure:
    """A page that could not be decoded; its neighbours are unaffected."""

    index: int
    problem: ProblemError


def target_size(width: float, height: float, cfg: PreprocessConfig) -> tuple[int, int]:
    """The normalized ``(width, height)`` for a page of ``width x height`` client pixels.

    ``cfg.max_side`` (when non-zero) first shrinks the page so its longer side fits, then
    :func:`~ocrserve.preprocess.geometry.smart_resize` (Qwen2-VL's rule) applies the pixel budget.

    Raises:
        PayloadTooLarge: aspect ratio above :data:`MAX_ASPECT_RATIO`.
    """
    ratio = max(width, height) / max(min(width, height), 1)
    if ratio > MAX_ASPECT_RATIO:
        raise PayloadTooLarge(f"aspect ratio {ratio:.0f}:1 exceeds {MAX_ASPECT_RATIO}:1", slug="aspect-ratio")
    if cfg.max_side and max(width, height) > cfg.max_side:
        shrink = cfg.max_side / max(width, height)
        width, height = width * shrink, height * shrink
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return w, h


_PAGE_RANGE = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?")


def page_ranges(spec: str) -> list[tuple[int, int]]:
    """The 1-based inclusive ``(first, last)`` ranges of ``"1-3,5"``, checked without a document.

    Raises:
        BadRequest: malformed ranges, or one that is empty or below 1.
    """
    ranges = []
    for part in spec.split(","):
        found = _PAGE_RANGE.fullmatch(part.strip())
        if found is None:
            raise BadRequest(f"pages={spec!r}: expected ranges like 1-3,5")
        lo, hi = int(found[1]), int(found[2] or found[1])
        if lo < 1 or hi < lo:
            raise BadRequest(f"pages={spec!r}: range {part.strip()!r} is empty or below 1")
        ranges.append((lo, hi))
    return ranges


def parse_page_ranges(spec: str | None, page_count: int) -> list[int]:
    """Turn ``"1-3,5"`` (1-based, inclusive) into sorted 0-based page indices.

    ``None`` or an empty string selects every page.

    Raises:
        BadRequest: malformed ranges (:func:`page_ranges`), or a page beyond ``page_count``.
    """
    if not spec or not spec.strip():
        return list(range(page_count))
    chosen: set[int] = set()
    for lo, hi in page_ranges(spec):
        if hi > page_count:
            raise BadRequest(f"pages={spec!r}: the document has {page_count} page(s)")
        chosen.update(range(lo - 1, hi))
    return sorted(chosen)


#: Signatures at offset 0 of the image formats the preprocessor reads (Pillow's own checks).
IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"II*\x00", b"MM\x00*", b"RIFF", b"BM", b"GIF8")


def _is_pdf(head: bytes) -> bool:
    """A file with an image's signature at offset 0 is that image, even with ``%PDF-`` in a text chunk;
    otherwise a PDF is one with ``%PDF-`` in its first 1024 bytes, where PDF readers accept the
    header (ISO 32000-1, annex H.3)."""
    return not head.startswith(IMAGE_MAGIC) and b"%PDF-" in head[:1024]


@contextlib.contextmanager
def decoder_errors(what: str) -> Iterator[None]:
    """The one place where a decoder's failure on a client's file becomes a problem: a 415 naming
    ``what`` (``"the document"``, ``"page 3"``) and the decoder's error. Every call into Pillow and
    pdfium runs inside it, so a decoder error cannot become a 500. Problems pass through as they
    are. It runs in a decoding process whose memory is capped (``preprocess.worker_memory_mb``), so
    a ``MemoryError`` is the file's doing: a 422.

    Raises:
        UnsupportedMedia: the decoder raised; a cut file's "image file is truncated" becomes
            "image data ends early" (slug ``truncated``, :mod:`.integrity`).
        PoisonDocument: decoding ran out of the process's memory.
    """
    try:
        yield
    except ProblemError:
        raise
    except MemoryError:
        raise PoisonDocument(
            f"{what} needs more memory to decode than preprocess.worker_memory_mb allows", slug="decoder-memory"
        ) from None
    except OSError as exc:
        if "truncated" in str(exc):  # Pillow: "image file is truncated (N bytes not processed)"
            raise ends_early(str(exc), what) from None
        raise UnsupportedMedia(f"{what} cannot be decoded: {type(exc).__name__}: {exc}", slug="undecodable") from None
    except Exception as exc:  # Pillow and pdfium raise many types on malformed input
        raise UnsupportedMedia(f"{what} cannot be decoded: {type(exc).__name__}: {exc}", slug="undecodable") from None


def _read_head(source: Source, size: int = 1024) -> bytes:
    if isinstance(source, bytes):
        return source[:size]
    with open(source, "rb") as fh:
        return fh.read(size)


def _open_pdf(source: Source) -> pdfium.PdfDocument:
    return pdfium.PdfDocument(source if isinstance(source, bytes) else str(source))


def _open_image(source: Source) -> Image.Image:
    try:
        image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else source)
    except UnidentifiedImageError:
        check_tiff_directory(
            _read_head(source, 8), len(source) if isinstance(source, bytes) else Path(source).stat().st_size
        )
        raise UnsupportedMedia(
            "not a supported document: expected JPEG, PNG, TIFF, WebP, BMP, GIF or PDF",
            slug="unsupported-media-type",
        ) from None
    if image.format not in IMAGE_FORMATS:
        raise UnsupportedMedia(f"{image.format} images are not supported", slug="unsupported-media-type")
    return image


def _page_frames(image: Image.Image, max_pages: int) -> tuple[int, ...]:
    """Frame numbers that are pages: GIFs give their first frame; TIFF overview levels are skipped.
    Counting stops at ``max_pages + 1`` pages, enough to refuse the document (a small TIFF may
    declare tens of thousands of frames)."""
    if image.format == "GIF":
        return (0,)
    frames = []
    for number, frame in enumerate(ImageSequence.Iterator(image)):
        subfile = frame.tag_v2.get(TIFF_NEW_SUBFILE_TYPE, 0) if image.format == "TIFF" else 0
        if not subfile & 1:
            frames.append(number)
            if len(frames) > max_pages:
                break
    return tuple(frames) or (0,)


def inspect_document(source: Source, cfg: PreprocessConfig) -> DocumentInfo:
    """Identify a document and count its pages, decoding no pixels.

    Raises:
        UnsupportedMedia: empty, unknown or undecodable file (415).
        PayloadTooLarge: more than ``cfg.max_document_pages`` pages (413).
    """
    head = _read_head(source)
    if not head:
        raise UnsupportedMedia("the upload is empty", slug="empty")
    with decoder_errors("the document"):
        return _inspect(source, head, cfg)


def _inspect(source: Source, head: bytes, cfg: PreprocessConfig) -> DocumentInfo:
    if _is_pdf(head):
        pdf = _open_pdf(source)
        try:
            sizes = _pdf_page_sizes(pdf, cfg)
            _check_page_count(len(sizes), cfg)
            info = DocumentInfo("pdf", len(sizes), sizes)
        finally:
            pdf.close()
    else:
        image = _open_image(source)
        frames = _page_frames(image, cfg.max_document_pages)
        _check_page_count(len(frames), cfg)
        info = DocumentInfo("image", len(frames), tuple(_frame_size(image, f) for f in frames), frames)
        image.close()
    return info


def _check_page_count(count: int, cfg: PreprocessConfig) -> None:
    if count == 0:
        raise UnsupportedMedia("the document has no pages", slug="empty")
    if count > cfg.max_document_pages:
        raise PayloadTooLarge(
            f"the document has {count} pages or more; the limit is preprocess.max_document_pages="
            f"{cfg.max_document_pages}",
            slug="too-many-pages",
        )


def _frame_size(image: Image.Image, frame: int) -> tuple[int, int]:
    image.seek(frame)
    return image.size


def _pdf_page_sizes(pdf: pdfium.PdfDocument, cfg: PreprocessConfig) -> tuple[tuple[int, int], ...]:
    """The size (:func:`_pdf_page_size`) of each page the PDF's page tree holds, however its root's
    ``/Count`` lies; at most ``cfg.max_document_pages + 1`` of them (enough to refuse the document).

    PDFium takes a ``/Count`` between 1 and 2^20 - 1 as the number of pages and walks the page tree
    only for any other (``CountPages`` in ``fpdf_document``'s ``cpdf_document.cpp``): one page under
    ``/Count 0``, ``-1`` or ``2^31`` was read, one under ``/Count 2`` or ``150`` was refused when the
    missing second page was looked up. Every index below ``/Count`` is looked up here in turn (each
    lookup walks the tree) and the pages are those found before the first missing one, so all five
    read the one real page. A ``/Count`` below the real number of pages cannot be seen through:
    PDFium looks up no page beyond it.

    Raises:
        pdfium.PdfiumError: not even the first page can be found (a tree with no leaf, or a loop).
    """
    sizes = []
    for index in range(min(len(pdf), cfg.max_document_pages + 1)):
        try:
            sizes.append(_pdf_page_size(pdf, index, cfg))
        except pdfium.PdfiumError:
            if index == 0:
                raise
            log.info("PDF /Count says %d pages; its page tree holds %d", len(pdf), index)
            break
    return tuple(sizes)


def _pdf_page_size(pdf: pdfium.PdfDocument, index: int, cfg: PreprocessConfig) -> tuple[int, int]:
    """A PDF page's ``(width, height)`` in pixels at ``cfg.pdf_dpi``, after ``/Rotate``.

    Read with ``FPDF_GetPageSizeByIndexF``, which does not parse the page's content as loading the
    page does: counting a document's pages costs nothing however heavy their content streams (12
    pages sharing one stream of 50 M operators took minutes to inspect)."""
    width_pt, height_pt = pdf.get_page_size(index)
    dpi_scale = cfg.pdf_dpi / PDF_POINTS_PER_INCH
    return max(1, round(width_pt * dpi_scale)), max(1, round(height_pt * dpi_scale))


def _check_pixels(width: int, height: int, cfg: PreprocessConfig, index: int) -> None:
    if width * height > cfg.max_page_pixels:
        raise PayloadTooLarge(
            f"page {index + 1} is {width} x {height} = {width * height:,} pixels; the limit is "
            f"preprocess.max_page_pixels={cfg.max_page_pixels:,}",
            slug="too-many-pixels",
        )


def decoded_bytes(image: Image.Image) -> int:
    """Bytes Pillow allocates for ``image``'s current frame when it is decoded: width x height x
    pixel size, where an 8-bit image of 2 to 4 bands takes 4 bytes a pixel (``libImaging/Storage.c``
    stores RGB as RGBX) and 16- and 32-bit samples take 2 and 4 bytes."""
    mode = ImageMode.getmode(image.mode)
    sample = np.dtype(mode.typestr).itemsize
    return image.width * image.height * sample * (1 if len(mode.bands) == 1 else 4)


def _check_bytes(image: Image.Image, cfg: PreprocessConfig, index: int) -> None:
    if (size := decoded_bytes(image)) > cfg.max_page_bytes:
        raise PayloadTooLarge(
            f"page {index + 1} decodes to {size / 2**20:,.0f} MiB ({image.width} x {image.height}, "
            f"mode {image.mode}); the limit is preprocess.max_page_bytes={cfg.max_page_bytes:,}",
            slug="too-many-bytes",
        )


def _resized(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """``image`` resized to ``size`` in its own mode (16-bit and float included), so that colour
    conversion runs on the small page. 1-bit and palette images, which ``Image.resize`` would
    resample by nearest neighbour only, are widened to gray and RGB(A) first."""
    if image.mode == "1":
        image = image.convert("L")
    elif image.mode == "P":
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.size == size:
        return image
    # Pillow's reduce(), the first step of reducing_gap, has no 16-bit kernels.
    gap = None if image.mode.startswith("I;16") else 3.0
    return image.resize(size, Image.Resampling.LANCZOS, reducing_gap=gap)


def _to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB: alpha flattened onto white, CMYK through its ICC profile
    when one is embedded, 16/32-bit and float gray stretched to 8 bits. Meant for a page already
    at its normalized size: the 16-bit path makes float copies of the page."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        data = np.asarray(image, dtype=np.float32)
        lo, hi = float(data.min()), float(data.max())
        scaled = (data - lo) * (255.0 / (hi - lo)) if hi > lo else np.zeros_like(data)
        image = Image.fromarray(scaled.astype(np.uint8), "L")
    if image.mode == "CMYK" and image.info.get("icc_profile"):
        try:
            source = ImageCms.ImageCmsProfile(io.BytesIO(image.info["icc_profile"]))
            return ImageCms.profileToProfile(image, source, ImageCms.createProfile("sRGB"), outputMode="RGB")
        except (ImageCms.PyCMSError, OSError):
            pass  # a broken profile: fall back to Pillow's naive conversion below
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB") if image.mode != "RGB" else image


def _oriented_size(image: Image.Image) -> tuple[int, int]:
    """``(width, height)`` after EXIF orientation (tags 5-8 swap the sides)."""
    orientation = image.getexif().get(0x0112, 1)
    width, height = image.size
    return (height, width) if orientation in (5, 6, 7, 8) else (width, height)


def _decode_image_page(image: Image.Image, frame: int, index: int, cfg: PreprocessConfig) -> Page:
    """Decode one frame and normalize it. The frame is checked against ``max_page_pixels`` and
    ``max_page_bytes`` before ``getexif()`` (which decodes a PNG whole), turned upright in place and
    resized in its own mode; only the small page is converted to RGB, so the largest allocation is
    the decoded frame itself (a 16-bit 12000 x 12000 PNG took 3.6 GB in float64 copies)."""
    started = time.perf_counter()
    rgb, width, height = _upright_frame(image, frame, index, cfg, lambda w, h: target_size(w, h, cfg))
    return _page(index, rgb, width, height, cfg, started)


def _upright_frame(
    image: Image.Image, frame: int, index: int, cfg: PreprocessConfig, size_of: Callable[[int, int], tuple[int, int]]
) -> tuple[Image.Image, int, int]:
    """Frame ``frame`` decoded (checked first), turned upright, resized in its own mode to
    ``size_of(width, height)`` of its upright size and converted to RGB; and that ``width``,
    ``height``.

    Raises:
        PayloadTooLarge: above ``max_page_pixels`` or ``max_page_bytes`` (413).
        UnsupportedMedia: its image data ends early (415).
    """
    image.seek(frame)
    _check_pixels(*image.size, cfg, index)
    _check_bytes(image, cfg, index)
    check_image_data(image, frame, f"page {index + 1}")
    width, height = _oriented_size(image)
    out_w, out_h = size_of(width, height)
    if image.format == "JPEG" and out_w < width:
        # JPEG draft mode decodes at 1/2, 1/4 or 1/8 scale straight from the DCT coefficients.
        raw_w, raw_h = image.size
        shrink = out_w / width
        image.draft(image.mode, (math.ceil(raw_w * shrink), math.ceil(raw_h * shrink)))
    image.load()
    ImageOps.exif_transpose(image, in_place=True)
    return _to_rgb(_resized(image, (out_w, out_h))), width, height


def _rendered(page: pdfium.PdfPage, size: tuple[int, int]) -> Image.Image:
    """A PDF page rendered on white at the scale that covers ``size`` (``/Rotate`` honoured)."""
    width_pt, height_pt = page.get_size()
    scale = max(size[0] / width_pt, size[1] / height_pt)
    return page.render(scale=scale, fill_color=(255, 255, 255, 255), may_draw_forms=True).to_pil()


def _render_pdf_page(pdf: pdfium.PdfDocument, index: int, cfg: PreprocessConfig) -> Page:
    """Render one PDF page straight at the scale its pixel budget allows (``/Rotate`` honoured),
    with its text layer's result where ``preprocess.pdf_text`` takes it (:mod:`.textlayer`)."""
    started = time.perf_counter()
    width, height = _pdf_page_size(pdf, index, cfg)
    _check_pixels(width, height, cfg, index)
    out_w, out_h = target_size(width, height, cfg)
    page = pdf[index]
    try:
        text_layer = read_text_layer(page, index, width, height, cfg.pdf_text)
        rendered = _rendered(page, (out_w, out_h)).convert("RGB")
    finally:
        page.close()
    if rendered.size != (out_w, out_h):
        rendered = rendered.resize((out_w, out_h), Image.Resampling.LANCZOS)
    decoded = _page(index, rendered, width, height, cfg, started)
    decoded.text_layer = text_layer
    return decoded


def _page(index: int, image: Image.Image, width: int, height: int, cfg: PreprocessConfig, started: float) -> Page:
    """The :class:`Page` of a decoded RGB ``image`` at its normalized size; ``width``/``height`` are
    the client's pixels, ``started`` the ``time.perf_counter()`` instant decoding began. With
    ``preprocess.blank_check`` a page with no ink is marked ``blank`` (:mod:`.blank`)."""
    blank = cfg.blank_check and is_blank(image)
    return Page(
        index=index,
        image=np.asarray(image),
        width=width,
        height=height,
        visual_tokens=visual_tokens(image.height, image.width, cfg.factor),
        preprocess_s=time.perf_counter() - started,
        orientation=cfg.orientation == "auto",
        blank=blank,
    )


def decode_pages(
    source: Source, info: DocumentInfo, indices: Sequence[int], cfg: PreprocessConfig
) -> list[Page | DecodeFailure]:
    """Decode and normalize the pages ``indices`` (0-based) of an inspected document.

    Runs in a worker process. Returns, in the order of ``indices``, each page or its failure: a
    page above ``cfg.max_page_pixels`` (413) or one that cannot be decoded (415) fails alone.
    """
    return _each_page(source, info, indices, cfg, _render_pdf_page, _decode_image_page, _decode_or_fail)


def _each_page(
    source: Source,
    info: DocumentInfo,
    indices: Sequence[int],
    cfg: PreprocessConfig,
    pdf_page: Callable,
    image_page: Callable,
    run: Callable,
) -> list:
    """Open the document once and return ``run(one, i)`` for each of ``indices``, where ``one(i)``
    is ``pdf_page(pdf, i, cfg)`` or ``image_page(image, frame, i, cfg)``.

    Raises:
        UnsupportedMedia: the document cannot be opened (415).
    """
    with decoder_errors("the document"):
        document = _open_pdf(source) if info.kind == "pdf" else _open_image(source)
    if info.kind == "pdf":
        one = lambda i: pdf_page(document, i, cfg)  # noqa: E731
    else:
        one = lambda i: image_page(document, info.frames[i], i, cfg)  # noqa: E731
    try:
        return [run(one, i) for i in indices]
    finally:
        document.close()


def preview_pages(
    source: Source, info: DocumentInfo, indices: Sequence[int], cfg: PreprocessConfig
) -> list[np.ndarray | None]:
    """The pages ``indices`` of an inspected document, grey, at :data:`PREVIEW_PIXELS` at most (a
    PDF's at :data:`PDF_PREVIEW_OVERSAMPLE` times the side), as decoding would normalize them
    (upright, alpha on white): what their line units are counted on (:mod:`.lines`) before the request
    is admitted. Runs in a worker process.

    Returns:
        For each page, a ``(height, width)`` uint8 array, or None where a preview would cost more
        than decoding is worth (an image frame of over :data:`PREVIEW_DECODE_PIXELS` that is not a
        JPEG) or the page cannot be decoded (its decoding reports why).
    """
    try:
        return _each_page(source, info, indices, cfg, _preview_pdf_page, _preview_image_page, _preview_or_none)
    except ProblemError:  # the document itself: its decoding reports it
        return [None] * len(indices)


def _preview_size(width: int, height: int, cfg: PreprocessConfig, oversample: int = 1) -> tuple[int, int]:
    """The normalized size of a ``width`` x ``height`` page, brought down to :data:`PREVIEW_PIXELS`
    x ``oversample`` squared where larger."""
    out_w, out_h = target_size(width, height, cfg)
    scale = min(1.0, oversample * math.sqrt(PREVIEW_PIXELS / (out_w * out_h)))
    return max(1, round(out_w * scale)), max(1, round(out_h * scale))


def _preview_image_page(image: Image.Image, frame: int, index: int, cfg: PreprocessConfig) -> np.ndarray | None:
    image.seek(frame)
    if image.format != "JPEG" and image.width * image.height > PREVIEW_DECODE_PIXELS:
        return None
    rgb, _, _ = _upright_frame(image, frame, index, cfg, lambda w, h: _preview_size(w, h, cfg))
    return np.asarray(rgb.convert("L"))


def _preview_pdf_page(pdf: pdfium.PdfDocument, index: int, cfg: PreprocessConfig) -> np.ndarray:
    width, height = _pdf_page_size(pdf, index, cfg)
    _check_pixels(width, height, cfg, index)
    out_w, out_h = _preview_size(width, height, cfg, PDF_PREVIEW_OVERSAMPLE)
    page = pdf[index]
    try:
        return np.asarray(_rendered(page, (out_w, out_h)).convert("L"))
    finally:
        page.close()


def _preview_or_none(preview, index: int) -> np.ndarray | None:
    try:
        with decoder_errors(f"page {index + 1}"):
            return preview(index)
    except ProblemError:
        return None


def _decode_or_fail(decode, index: int) -> Page | DecodeFailure:
    try:
        with decoder_errors(f"page {index + 1}"):
            return decode(index)
    except ProblemError as problem:
        return DecodeFailure(index, problem)


class Preprocessor:
    """Runs :func:`inspect_document` and :func:`decode_pages` in two process pools: one for
    interactive work (priority <= :data:`~ocrserve.work.URGENT`), and one for everything else
    (``preprocess.background_workers`` processes at ``preprocess.background_scheduling``), so that the
    decoding of a flood of documents never holds up, nor takes the cores from, an interactive page.

    Args:
        cfg: limits and pixel budget.

    Use :meth:`inspect` (fast, checks the page limit), then iterate :meth:`pages`.
    """

    def __init__(self, cfg: PreprocessConfig):
        self.cfg = cfg
        self._pool = DecodePool(cfg)
        background = BackgroundPriority(cfg.background_scheduling, cfg.background_nice)
        workers = cfg.background_workers or self._pool.size
        self._background = DecodePool(cfg, workers, background)
        # line counting (:meth:`line_units`): as many threads as each pool has processes
        self._counting = ThreadPoolExecutor(self._pool.size, "ocrserve-lines")
        counting = BackgroundPriority("nice", cfg.background_nice)  # see line_units
        self._counting_background = ThreadPoolExecutor(workers, "ocrserve-lines-bg", initializer=counting.apply)
        opencv_on_calling_threads()  # the background count's OpenCV work at its thread's priority

    def _pool_for(self, priority: int) -> DecodePool:
        return self._pool if is_urgent(priority) else self._background

    async def inspect(self, source: Source, priority: int = 0) -> DocumentInfo:
        """Identify the document and count its pages (see :func:`inspect_document`); ``priority``
        picks the pool and orders the task among those waiting for one of its processes (lower first)."""
        return await self._pool_for(priority).run(inspect_document, source, self.cfg, priority=priority)

    async def previews(
        self, source: Source, info: DocumentInfo, indices: Sequence[int], priority: int = 0
    ) -> list[np.ndarray | None]:
        """:func:`preview_pages` of the first :data:`PREVIEW_PAGES` of ``indices``, in a decoding
        process (``priority`` as for :meth:`inspect`)."""
        first = list(indices[:PREVIEW_PAGES])
        return await self._pool_for(priority).run(preview_pages, source, info, first, self.cfg, priority=priority)

    async def pages(
        self, source: Source, info: DocumentInfo, indices: Sequence[int], priority: int = 0
    ) -> AsyncIterator[list[Page | DecodeFailure]]:
        """Yield decoded pages in chunks of up to :data:`PAGES_PER_TASK`, in order.

        Chunks are decoded in parallel, at most one per process ahead of the consumer; ``priority``
        picks the pool and orders them among the tasks waiting for one of its processes (lower first).
        """
        pool = self._pool_for(priority)
        chunks = [list(indices[i : i + PAGES_PER_TASK]) for i in range(0, len(indices), PAGES_PER_TASK)]
        pending: list[asyncio.Future] = []
        try:
            for chunk in chunks:
                decoded = pool.run(decode_pages, source, info, chunk, self.cfg, pages=len(chunk), priority=priority)
                pending.append(asyncio.ensure_future(decoded))
                if len(pending) >= pool.size:
                    yield await pending.pop(0)
            while pending:
                yield await pending.pop(0)
        finally:
            for future in pending:
                future.cancel()

    async def warm_up(self) -> None:
        """Start every decoding process now rather than on the first request."""
        await asyncio.gather(self._pool.warm_up(), self._background.warm_up())

    def worker_pids(self) -> list[int]:
        """Process ids of the decoding processes started so far (interactive ones first)."""
        return self._pool.pids() + self._background.pids()

    async def line_units(self, images: list[np.ndarray | None], priority: int = 0) -> list[float | None]:
        """:func:`~ocrserve.preprocess.lines.units_each` of ``images`` (a request's previews, or a
        decoded page), on threads of the gateway's own: a background request's (``priority`` as for
        :meth:`inspect`) at ``preprocess.background_nice`` (10: 110 / 1134 of a core it shares with
        a thread at normal priority), so that counting a flood of documents yields the cores to
        interactive pages, but not at SCHED_IDLE, where it would share them with the bulk pages the
        engine runs at SCHED_IDLE: a document is admitted only once it is counted, and the engine
        has work queued meanwhile. At normal priority, a flood of 4-page documents of turned pages
        (12 clients, a single page every 0.5 s beside them) held the single page at 2.03 times its
        idle p95. At SCHED_IDLE, beside a CPU hog, twelve 2-page receipts were counted about 1 s
        apart, and the last four were refused after the 10 s ``router.admission_timeout_s``, where
        the engine alone would have finished all twelve in time."""
        # imported here, not with this module: the decoding processes import it, and rapidocr's
        # libraries would count against preprocess.worker_memory_mb there (a 12000 x 12000 page
        # that decodes within it failed with them)
        from ocrserve.preprocess.lines import units_each

        pool = self._counting if is_urgent(priority) else self._counting_background
        return await asyncio.get_running_loop().run_in_executor(pool, units_each, images)

    def close(self) -> None:
        """Stop the decoding processes (queued work is cancelled; waits for them to exit) and the
        counting threads."""
        self._pool.close()
        self._background.close()
        self._counting.shutdown(wait=False, cancel_futures=True)
        self._counting_background.shutdown(wait=False, cancel_futures=True)
