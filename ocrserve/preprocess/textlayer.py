"""A PDF page's own text layer, where it holds the page's visible text: born-digital pages are
answered from it, with its positions, without OCR.

A page goes to the engine instead (``preprocess.pdf_text: auto``) when its text layer

* is empty or nearly so (fewer than :data:`MIN_CHARS` letters and digits),
* is invisible (text render mode 3, ``FPDF_TEXTRENDERMODE_INVISIBLE``: the text an OCR tool laid
  under a scan, which is only as good as that tool),
* is garbage (more than :data:`MAX_UNMAPPED` of its characters without a Unicode mapping:
  U+FFFD, private-use or unassigned code points, as fonts without a ``ToUnicode`` map give), or
* does not cover the page: an image covers at least :data:`SCAN_COVER` of the page (a scan with
  a stamp or a header of real text).

Text comes from PDFium's text page: its characters with their boxes (``FPDFText_GetCharBox``),
in PDFium's order, make runs on one line each, merged into lines where they continue one
another, put into the rendered page's pixels (``/Rotate`` honoured) and ordered by
:mod:`ocrserve.layout` like any engine's lines.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c

from ocrserve.layout import arrange
from ocrserve.pages import Line, PageResult

#: Letters and digits a text layer needs before it is taken as the page's text.
MIN_CHARS = 16
#: Share of characters without a Unicode mapping above which a text layer is garbage.
MAX_UNMAPPED = 0.1
#: Share of the page an image may cover before the page counts as a scan.
SCAN_COVER = 0.5
#: Characters or runs on one line closer than this many line heights are one line.
JOIN_GAP = 1.0
#: What PDFium gives for a soft hyphen at a line's end (U+0002 in its own text, U+FFFE through
#: pypdfium2, U+00AD from some producers): the hyphen that was printed.
SOFT_HYPHENS = {"\x02": "-", "\ufffe": "-", "\xad": "-"}
#: Rectangles of one line further apart than this many heights are separate words (a word space
#: is about a third of an em; a ligature's glyph sits closer).
WORD_GAP = 0.3


@dataclass
class _Run:
    """A run of text in PDF user space (points, origin bottom left)."""

    text: str
    left: float
    bottom: float
    right: float
    top: float


def read_text_layer(page: pdfium.PdfPage, index: int, width: int, height: int, policy: str) -> PageResult | None:
    """The page's result from its text layer, or None where it must be OCR'd (module docstring).

    Args:
        page: the open PDF page.
        index: its 0-based number in the document.
        width, height: the rendered page's size in client pixels (after ``/Rotate``).
        policy: ``preprocess.pdf_text``: ``auto``, ``always`` (any text the layer has) or ``never``.
    """
    if policy == "never":
        return None
    textpage = page.get_textpage()
    try:
        runs = _runs(textpage)
    finally:
        textpage.close()
    text = "".join(run.text for run in runs)
    if policy == "auto" and not _usable(page, text):
        return None
    if not text.strip():
        return None
    lines = _lines(_merged(runs), page, width)
    rotation = page.get_rotation()
    arranged = arrange(lines, width, height, rotation)
    return PageResult(
        index=index,
        width=width,
        height=height,
        text=arranged.text,
        lines=arranged.lines,
        blocks=arranged.blocks,
        rotation=rotation,
        skew_deg=arranged.skew_deg,
        source="text_layer",
    )


def _runs(textpage: pdfium.PdfTextPage) -> list[_Run]:
    """The page's characters in PDFium's order as runs on one line each: a run ends at PDFium's
    generated line break, where the next character drops to another line, or leaves a gap of
    :data:`JOIN_GAP` heights. Soft hyphens at a line's end become ``-``; other control characters
    are dropped."""
    text = textpage.get_text_range(0, textpage.count_chars())
    runs: list[_Run] = []
    current: _Run | None = None
    for index, char in enumerate(text):
        if char in "\r\n":
            current = None
            continue
        char = SOFT_HYPHENS.get(char, char)
        if unicodedata.category(char) == "Cc":
            continue
        left, bottom, right, top = textpage.get_charbox(index)
        if right <= left or top <= bottom:  # a generated space: no box of its own
            if current is not None:
                current.text += char
            continue
        glyph = _Run(char, left, bottom, right, top)
        if current is not None and _continues(current, glyph):
            current.text += char
            current.left, current.right = min(current.left, left), max(current.right, right)
            current.bottom, current.top = min(current.bottom, bottom), max(current.top, top)
        else:
            current = glyph
            runs.append(current)
    return [run for run in runs if run.text.strip()]


def _usable(page: pdfium.PdfPage, text: str) -> bool:
    """Whether the layer holds the page's visible text (module docstring)."""
    if sum(ch.isalnum() for ch in text) < MIN_CHARS:
        return False
    unmapped = sum(ch == "\ufffd" or unicodedata.category(ch) in ("Co", "Cn") for ch in text)
    if unmapped > MAX_UNMAPPED * len(text):
        return False
    texts, images = [], []
    for obj in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_TEXT, pdfium_c.FPDF_PAGEOBJ_IMAGE], max_depth=8):
        (texts if obj.type == pdfium_c.FPDF_PAGEOBJ_TEXT else images).append(obj)
    invisible = sum(
        pdfium_c.FPDFTextObj_GetTextRenderMode(t.raw) == pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE for t in texts
    )
    if invisible * 2 > len(texts):
        return False
    page_w, page_h = page.get_size()
    return not any(_area(image.get_bounds()) >= SCAN_COVER * page_w * page_h for image in images)


def _area(bounds: tuple[float, float, float, float]) -> float:
    left, bottom, right, top = bounds
    return max(0.0, right - left) * max(0.0, top - bottom)


def _merged(runs: list[_Run]) -> list[_Run]:
    """Runs in PDFium's order, each joined to the previous one where it continues it on the same
    line (their vertical extents overlap by half and the gap is under :data:`JOIN_GAP` heights)."""
    lines: list[_Run] = []
    for run in runs:
        last = lines[-1] if lines else None
        if last is not None and _continues(last, run):
            gap = run.left - last.right
            space = "" if last.text.endswith(" ") or gap < WORD_GAP * (last.top - last.bottom) else " "
            last.text += space + run.text
            last.right = max(last.right, run.right)
            last.bottom, last.top = min(last.bottom, run.bottom), max(last.top, run.top)
        else:
            lines.append(_Run(run.text, run.left, run.bottom, run.right, run.top))
    return lines


def _continues(last: _Run, run: _Run) -> bool:
    height = max(last.top - last.bottom, run.top - run.bottom, 1e-6)
    overlap = min(last.top, run.top) - max(last.bottom, run.bottom)
    gap = run.left - last.right
    return overlap >= 0.5 * min(last.top - last.bottom, run.top - run.bottom) and -height <= gap < JOIN_GAP * height


def _lines(runs: list[_Run], page: pdfium.PdfPage, width: int) -> list[Line]:
    """``runs`` as lines with their boxes in the rendered page's pixels, ``width`` wide: PDF points
    turned as ``/Rotate`` turns the page (clockwise) when it is displayed, then scaled."""
    page_w, page_h = page.get_size()
    rotation = page.get_rotation()
    scale = width / (page_h if rotation in (90, 270) else page_w)

    def pixel(x: float, y: float) -> list[float]:
        u, v = x, page_h - y  # unrotated, origin top left
        turned = {0: (u, v), 90: (page_h - v, u), 180: (page_w - u, page_h - v), 270: (v, page_w - u)}[rotation]
        return [round(turned[0] * scale, 1), round(turned[1] * scale, 1)]

    return [
        Line(
            run.text.strip(),
            [
                pixel(run.left, run.top),
                pixel(run.right, run.top),
                pixel(run.right, run.bottom),
                pixel(run.left, run.bottom),
            ],
            1.0,
        )
        for run in runs
    ]
