"""How much text a page holds, seen cheaply: its *marks*, the character-sized blobs of ink.

Recognition dominates an OCR engine's time on a page full of text, and it grows with the characters
on the page; detection grows with the page's pixels. Pixels are known from a page's size alone;
characters are not. A page's marks stand in for them: the connected components of its ink (Otsu's
threshold on the grey page, brought down to :data:`~ocrserve.preprocess.MARKS_PIXELS` first, its
rules taken out: :func:`without_rules`) that are no taller than :data:`MAX_MARK_HEIGHT` of the page
(a frame or a dark border is one large component, not text). A Latin character is one mark or two,
a CJK character several, and characters that touch on a poor scan count as one: a proxy, which the
admission's model of a page's seconds (:mod:`ocrserve.servicetime`) weighs by fitting it to
finished pages. With a form's rules left in, the characters touching them were one component with
them: a noisy held-out form scanned at 150 dpi counted 365 marks for the 1,353 characters read
(1.9 s against 0.9 s predicted); without them, 692 at 200 dpi (1.8 s against 1.2 s).

What marks do not see is where a line of text ends. The embedded engine's recognition gives each
detected line at least the width of one 6.7 times as wide as it is high (RapidOCR's
``rec_img_shape``, ``[3, 48, 320]``), so a page of short fields (a form, a table of numbers) costs
more than its marks say: on the held-out half, recognition ran 2.76 times over a fit on the marks
for a noisy form of 119 lines and 4.31 times for a table of 454, where a fit on the engine's own
lines, ``max(6.67, width / height)`` each, was within 0.98-1.05 (``docs/benchmarks.md``).

They are counted twice: before a request is admitted, on a small grey preview of its first pages
(:func:`~ocrserve.preprocess.preview_pages`, :func:`count_each`), so that admission prices a
burst by the text it holds; and on each decoded page as it is queued
(:class:`~ocrserve.pipeline.PagePipeline`), which replaces the estimate. Both in the gateway, on
a thread, not in the decoding processes (which only render the previews): there OpenCV's
libraries and thread pool count against ``preprocess.worker_memory_mb``, and a 12000 x 12000 page
that decoded within it before failed with them.

Measured on the development half of ``../shared/corpus`` (2026-12-03, 2 cores): marks against the
characters the embedded engine read: ``linn.png`` 3,031 / 4,474 (recognition 6.2 s),
``singlecol_01.png`` 1,511 / 1,861 (2.5 s), ``c02-22.pdf`` 1,254 / 1,108 (1.5 s),
``phototest.tif`` 239 / 284 (0.5 s), ``funsd_82253362_3364.png`` 572 / 1,214 (3.3 s, a noisy form
whose characters touch), ``segmodeimg.tif`` 24 / 34 (0.2 s); 0.5 to 20 ms a page on one core.
"""

from __future__ import annotations

import cv2  # opencv-python-headless: a dependency of rapidocr
import numpy as np

from ocrserve.preprocess import MARKS_PIXELS

#: A component taller than this share of the page is no character (a frame, a rule, a border).
MAX_MARK_HEIGHT = 0.1
#: A component of fewer pixels is noise (a speck of a scan).
MIN_MARK_PIXELS = 4
#: A straight run of ink at least this many times the marks' median height is a rule, not text
#: (:func:`without_rules`). Chosen on the development half of ``../shared/corpus``: at 5 the marks
#: of its pages without rules moved by 0-17% (``baiona_alpha.png``: 489 -> 572), and no page's
#: strokes broke apart; a length of 2% of the page's width broke the strokes of phototest's letters
#: (239 -> 708), and one of 8% those of a small page of Chinese (177 -> 315).
RULE_LENGTH = 5


def counted_pixels(height: int, width: int) -> int:
    """The pixels :func:`count_marks` counts a ``height`` x ``width`` page on: all of them up to
    :data:`~ocrserve.preprocess.MARKS_PIXELS`, then (the page brought down) those. A page's marks
    grow with these, not with its pixels: the same letter page has the same marks at 150 and 300
    dpi."""
    return min(height * width, MARKS_PIXELS)


def count_marks(image: np.ndarray) -> int:
    """The character-sized blobs of ink on a page (module docstring), the page's rules taken out
    first (:func:`without_rules`).

    Args:
        image: the normalized page, ``(height, width, 3)`` uint8 RGB or ``(height, width)`` grey.

    Returns:
        The number of marks, 0 for a page without ink.
    """
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY) if image.ndim == 3 else image
    scale = min(1.0, (MARKS_PIXELS / max(grey.size, 1)) ** 0.5)
    if scale < 1.0:
        grey = cv2.resize(grey, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    _, ink = cv2.threshold(grey, 0, 255, cv2.THRESH_BINARY_INV + cv2.THRESH_OTSU)
    if ink.mean() > 127:  # light text on a dark page: the ink is the lighter side
        ink = 255 - ink
    return int(_marks(without_rules(ink)).size)


def _marks(ink: np.ndarray) -> np.ndarray:
    """Heights of the marks among the connected components of ``ink`` (a 0/255 mask)."""
    _, _, stats, _ = cv2.connectedComponentsWithStats(ink, connectivity=8)
    areas, heights = stats[1:, cv2.CC_STAT_AREA], stats[1:, cv2.CC_STAT_HEIGHT]
    return heights[(areas >= MIN_MARK_PIXELS) & (heights <= MAX_MARK_HEIGHT * ink.shape[0])]


def without_rules(ink: np.ndarray) -> np.ndarray:
    """``ink`` (a 0/255 mask) less its rules: straight horizontal or vertical runs at least
    :data:`RULE_LENGTH` times its marks' median height (a morphological opening with a line, as in
    OpenCV's tutorial "Extract horizontal and vertical lines by using morphological operations").
    A form's characters that touch its lines are otherwise one component with them, too tall to
    count; ``ink`` itself where it holds no marks."""
    heights = _marks(ink)
    if not heights.size:
        return ink
    length = max(2, int(RULE_LENGTH * float(np.median(heights))))
    across = cv2.morphologyEx(ink, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_RECT, (length, 1)))
    down = cv2.morphologyEx(ink, cv2.MORPH_OPEN, cv2.getStructuringElement(cv2.MORPH_RECT, (1, length)))
    return cv2.subtract(ink, cv2.bitwise_or(across, down))


def count_each(previews: list[np.ndarray | None]) -> list[int | None]:
    """:func:`count_marks` of each of a request's page previews
    (:meth:`~ocrserve.preprocess.Preprocessor.previews`), None where there is none."""
    return [None if preview is None else count_marks(preview) for preview in previews]
