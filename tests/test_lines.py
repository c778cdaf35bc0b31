"""Counting a page's line units (its text lines, weighed as recognition weighs them), and the
pixels the embedded engine's detector reads: what admission prices a page by before the engine
sees it."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from rapidocr import RapidOCR

from ocrserve.config import PreprocessConfig
from ocrserve.engines.onnx import _vertical_padding, detector_input_size
from ocrserve.preprocess import PDF_PREVIEW_OVERSAMPLE, PREVIEW_PIXELS, decode_pages, inspect_document, preview_pages
from ocrserve.preprocess.lines import MIN_LINE_UNITS, line_units, units_each
from tests import samples
from tests.samples import phototest


def test_phototest_counts_the_lines_the_engines_own_detection_finds():
    """phototest's 8 lines of text, each far wider than recognition's smallest crop: the sum of
    their widths over heights, as RapidOCR's own pipeline (its detector at its own size) finds
    them."""
    page = np.asarray(phototest().convert("RGB"))
    boxes = np.asarray(RapidOCR(params={"Global.log_level": "warning"})(page[:, :, ::-1]).boxes)
    across = np.linalg.norm(boxes[:, 1] - boxes[:, 0], axis=1)
    down = np.linalg.norm(boxes[:, 3] - boxes[:, 0], axis=1)
    engines = float(np.maximum(MIN_LINE_UNITS, across / down).sum())
    assert len(boxes) == 8 and 90 <= engines <= 130
    assert line_units(page) == pytest.approx(engines, rel=0.1)


def test_a_blank_page_has_no_line_units_and_a_short_word_counts_as_recognitions_smallest_crop():
    white = np.full((1000, 800, 3), 255, np.uint8)
    assert line_units(white) == 0.0
    word = Image.fromarray(white)
    word.paste(phototest().convert("RGB").crop((30, 80, 110, 128)), (300, 400))  # "This is"
    assert line_units(np.asarray(word)) == pytest.approx(MIN_LINE_UNITS)


def test_a_large_or_turned_page_counts_as_the_same_text():
    """A page above a megapixel is brought down first, and a turned line is as long as an upright
    one: the same text at twice the size, or turned a quarter, keeps its count."""
    page = phototest()
    plain = line_units(np.asarray(page.convert("L")))
    double = page.resize((page.width * 2, page.height * 2), Image.Resampling.NEAREST)
    assert line_units(np.asarray(double.convert("L"))) == pytest.approx(plain, rel=0.1)
    assert line_units(np.asarray(page.convert("L").rotate(90, expand=True))) == pytest.approx(plain, rel=0.1)


PREVIEWED = {
    "a multi-page TIFF": (samples.DATA / "testTIFF_multipage.tif").read_bytes(),
    "an EXIF-turned JPEG": samples.exif_rotated_jpeg(),
    "a transparent PNG": (samples.DATA / "black_font_color_transparent.png").read_bytes(),
    "a PDF turned by /Rotate": samples.rotated_pdf(),
    "a 300-dpi scan": samples.encode(phototest().resize((2560, 1920)), "PNG"),
}


@pytest.mark.parametrize("document", PREVIEWED.values(), ids=PREVIEWED.keys())
def test_a_preview_holds_the_line_units_of_the_decoded_page(document):
    """What admission counts before decoding is what the decoded page holds: a preview as decoding
    would normalize the page (upright, alpha on white), small."""
    cfg = PreprocessConfig()
    info = inspect_document(document, cfg)
    indices = list(range(info.page_count))
    previews = preview_pages(document, info, indices, cfg)
    decoded = decode_pages(document, info, indices, cfg)
    oversample = PDF_PREVIEW_OVERSAMPLE if info.kind == "pdf" else 1
    for preview, page in zip(previews, decoded, strict=True):
        assert preview.ndim == 2 and preview.size <= PREVIEW_PIXELS * oversample**2 * 1.01
        assert line_units(preview) == pytest.approx(line_units(page.image), rel=0.1, abs=7)


def test_a_page_too_costly_to_decode_twice_or_undecodable_has_no_preview():
    cfg = PreprocessConfig()
    huge = samples.blank_png(4000, 4000)  # 16 Mpx, not a JPEG
    info = inspect_document(huge, cfg)
    assert preview_pages(huge, info, [0], cfg) == [None]
    truncated = samples.truncated_jpeg()
    assert units_each(preview_pages(truncated, inspect_document(truncated, cfg), [0], cfg)) == [None]


@pytest.mark.parametrize("height, width", [(56, 392), (39, 445), (445, 39), (480, 640), (2200, 1700), (1176, 840)])
def test_the_detector_input_size_is_rapidocrs_own(height, width):
    """What :func:`detector_input_size` computes is what rapidocr's own steps make of the page."""
    ocr = RapidOCR(params={"Global.log_level": "warning"})
    image, record = ocr.preprocess_img(np.zeros((height, width, 3), np.uint8))
    image, _ = _vertical_padding(ocr, image, record)
    real = ocr._load_det_model().get_preprocess().resize(image).shape[:2]
    assert detector_input_size(height, width) == real
