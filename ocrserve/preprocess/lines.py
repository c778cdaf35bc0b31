"""How much text a page holds, seen before the engine reads it: its *line units*, the text lines a
detector finds on a small copy of the page, each weighed as recognition weighs it.

Recognition dominates an OCR engine's time on a page full of text, and the embedded engine's
recognition runs once per detected line on the line's crop brought to 48 px high and at least
320 px wide (RapidOCR's ``rec_img_shape``, ``[3, 48, 320]``, ``rapidocr/config.yaml``): a line
costs its width over its height, and at least :data:`MIN_LINE_UNITS`, so a page of short fields
(a form, a table of numbers) costs more than its characters say. A page's line units are that sum
over the lines RapidOCR's own detection model (PP-OCR DB, from the ``rapidocr`` wheel) finds on
the page brought down to :data:`~ocrserve.preprocess.PREVIEW_PIXELS` and detected with its longer
side at :data:`DETECTOR_LIMIT`: the same lines the engine will find, on a copy small enough to
detect in a fraction of the engine's time on the page (the price: measured below). Admission's model of a page's seconds
(:mod:`ocrserve.servicetime`) weighs them by fitting them to finished pages; for a VLM, whose
decoding grows with the characters read, they are a proxy of the same kind.

Measured on every page of ``../shared/corpus`` (2026-12-05, 2 cores, the embedded engine alone,
one page at a time): the engine's own recognition took 2.34-2.65 ms a unit of its own lines on
the 17 pages of 500 units or more (``unlv_8071_093.3B.tif`` 1,273 units, 3.04 s;
``funsd_82253362_3364.png``, a noisy form of 119 lines, 886 units, 2.15 s;
``discoverworld_crazy_table4.pdf``, a table of 454 lines, 3,261 units, 7.75 s), where
character-sized blobs of ink had priced the form 2.8 and the table 4.3 times under a fit on other
pages. On the preview the detector found 0.91-1.01 of the engine's
units on the 26 pages of 150 units or more (the table 3,080, the form 864, ``linn.png`` 1,433 of
1,504), in 0.01-0.32 s a page with the engine's two threads and 0.01-0.39 s on the one it has
here; brought down to 640 px instead, 0.26-1.00 (the table 843), in 0.01-0.12 s. On the
development pages that count took 7-29% of the engine's own seconds on a page of 250 units or
more, 20-61% on pages of 100-180 units, and 72-120% on letter-size pages of a line or two
(0.18-0.32 s against 0.24-0.30 s): the gateway's CPU is what pricing a page by its lines costs.

They are counted before a request is admitted, on the grey previews of its first pages
(:func:`~ocrserve.preprocess.preview_pages`, :func:`units_each`), and on a decoded page that had
no preview (a job's pages, the pages past a request's previewed ones) as it is queued
(:class:`~ocrserve.pipeline.PagePipeline`). Both in the gateway, on threads of the preprocessor's
(:meth:`~ocrserve.preprocess.Preprocessor.line_units`: a background request's at background
priority), not in the decoding processes (which only render the previews): there the detector's
session and OpenCV's thread pool would count against ``preprocess.worker_memory_mb``.
"""

from __future__ import annotations

import threading

import cv2  # opencv-python-headless: a dependency of rapidocr
import numpy as np
from rapidocr import RapidOCR
from rapidocr.ch_ppocr_det import TextDetector

from ocrserve.preprocess import PREVIEW_PIXELS

#: Recognition's smallest crop, width over height: RapidOCR's ``rec_img_shape`` ``[3, 48, 320]``.
MIN_LINE_UNITS = 320 / 48
#: The detector's input for counting: the longer side brought down to 960 px (PaddleOCR's default
#: ``det_limit_side_len: 960, det_limit_type: max``, ``tools/infer/utility.py``); measured in the
#: module docstring against 640 px.
DETECTOR_LIMIT = (960, "max")

_detector: TextDetector | None = None
_lock = threading.Lock()


def detector() -> TextDetector:
    """The counting detector, built once per process on first use: RapidOCR's detection model from
    its wheel, at :data:`DETECTOR_LIMIT`, one thread (the gateway counts on threads of its own
    beside the engine's). Built through ``RapidOCR._load_det_model``, as the embedded engine's
    are (a private method: ``rapidocr`` is pinned below 4, and ``tests/test_lines.py`` runs it)."""
    global _detector
    with _lock:
        if _detector is None:
            side, kind = DETECTOR_LIMIT
            params = {
                "Global.log_level": "warning",
                "EngineConfig.onnxruntime.intra_op_num_threads": 1,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
                "Det.limit_side_len": side,
                "Det.limit_type": kind,
            }
            _detector = RapidOCR(params=params)._load_det_model()
        return _detector


def counted_pixels(height: int, width: int) -> int:
    """The pixels :func:`line_units` counts a ``height`` x ``width`` page on: all of them up to
    :data:`~ocrserve.preprocess.PREVIEW_PIXELS`, then (the page brought down) those. A page's line
    units grow with the text on these, not with its pixels: the same letter page holds the same
    lines at 150 and 300 dpi."""
    return min(height * width, PREVIEW_PIXELS)


def line_units(image: np.ndarray) -> float:
    """The line units of a page (module docstring): over the lines the detector finds,
    ``max(MIN_LINE_UNITS, longer side / shorter side)`` each (a turned line is as long as it is
    upright).

    Args:
        image: the normalized page or its preview, ``(height, width, 3)`` uint8 RGB or
            ``(height, width)`` grey.

    Returns:
        The page's line units, 0.0 for a page without text.
    """
    grey = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY) if image.ndim == 3 else image
    scale = min(1.0, (PREVIEW_PIXELS / max(grey.size, 1)) ** 0.5)
    if scale < 1.0:
        grey = cv2.resize(grey, None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)
    boxes = detector()(cv2.cvtColor(grey, cv2.COLOR_GRAY2BGR)).boxes
    if boxes is None or len(boxes) == 0:
        return 0.0
    quads = np.asarray(boxes, dtype=np.float64)  # (n, 4, 2): top-left, top-right, bottom-right, bottom-left
    across = np.linalg.norm(quads[:, 1] - quads[:, 0], axis=1)
    down = np.linalg.norm(quads[:, 3] - quads[:, 0], axis=1)
    longer, shorter = np.maximum(across, down), np.maximum(np.minimum(across, down), 1.0)
    return float(np.maximum(MIN_LINE_UNITS, longer / shorter).sum())


def units_each(previews: list[np.ndarray | None]) -> list[float | None]:
    """:func:`line_units` of each of a request's page previews
    (:meth:`~ocrserve.preprocess.Preprocessor.previews`), None where there is none."""
    return [None if preview is None else line_units(preview) for preview in previews]
