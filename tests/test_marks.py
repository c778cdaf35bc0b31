"""Counting a page's marks (character-sized blobs of ink), and the pixels the embedded engine's
detector reads: what admission prices a page by before the engine sees it."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw
from rapidocr import RapidOCR

from ocrserve.config import PreprocessConfig
from ocrserve.engines.onnx import _vertical_padding, detector_input_size
from ocrserve.preprocess import MARKS_PIXELS, PDF_PREVIEW_OVERSAMPLE, decode_pages, inspect_document, preview_pages
from ocrserve.preprocess.marks import count_each, count_marks
from tests import samples
from tests.samples import phototest


def test_phototest_has_about_as_many_marks_as_characters():
    """phototest holds 284 characters (its ground truth without spaces, 8 lines); "i" and "j" are
    two marks, touching letters one."""
    assert 220 <= count_marks(np.asarray(phototest())) <= 300


def test_a_blank_page_a_frame_and_a_rule_have_no_marks():
    white = np.full((1000, 800, 3), 255, np.uint8)
    assert count_marks(white) == 0
    framed = Image.fromarray(white)
    draw = ImageDraw.Draw(framed)
    draw.rectangle((20, 20, 780, 980), outline="black", width=6)  # one component, taller than a character
    draw.line((40, 500, 760, 500), fill="black", width=3)  # a rule: as tall as a character, but one mark
    assert count_marks(np.asarray(framed)) <= 1


def test_characters_on_a_forms_lines_count_one_by_one():
    """phototest with a rule along the foot of each text line and a vertical rule through all of
    them, each touching its characters, as on a form: without the rules taken out, each line with
    its rule would be one component (or the whole page one, too tall to count)."""
    page = phototest().convert("RGB")
    plain = count_marks(np.asarray(page))
    inked = (np.asarray(page.convert("L")) < 128).any(axis=1)
    feet = [y for y in range(1, len(inked)) if inked[y - 1] and not inked[y]]  # the row below each text line
    assert len(feet) >= 8
    draw = ImageDraw.Draw(page)
    for y in feet:
        draw.line((0, y - 2, page.width, y - 2), fill="black", width=3)
    draw.line((page.width // 2, 0, page.width // 2, page.height), fill="black", width=3)
    assert count_marks(np.asarray(page)) == pytest.approx(plain, rel=0.15)


def test_light_text_on_a_dark_page_counts_as_the_same_text():
    page = np.asarray(phototest())
    assert count_marks(255 - page) == pytest.approx(count_marks(page), rel=0.1)


def test_a_large_page_is_counted_on_a_smaller_copy():
    """A page above a megapixel is brought down first: the same text at twice the size keeps its count."""
    page = phototest()
    double = page.resize((page.width * 2, page.height * 2), Image.Resampling.NEAREST)
    assert count_marks(np.asarray(double.convert("L"))) == pytest.approx(count_marks(np.asarray(page)), rel=0.15)


PREVIEWED = {
    "a multi-page TIFF": (samples.DATA / "testTIFF_multipage.tif").read_bytes(),
    "an EXIF-turned JPEG": samples.exif_rotated_jpeg(),
    "a transparent PNG": (samples.DATA / "black_font_color_transparent.png").read_bytes(),
    "a PDF turned by /Rotate": samples.rotated_pdf(),
    "a 300-dpi scan": samples.encode(phototest().resize((2560, 1920)), "PNG"),
}


@pytest.mark.parametrize("document", PREVIEWED.values(), ids=PREVIEWED.keys())
def test_a_preview_holds_the_marks_of_the_decoded_page(document):
    """What admission counts before decoding is what the decoded page holds: a preview as decoding
    would normalize the page (upright, alpha on white), small."""
    cfg = PreprocessConfig()
    info = inspect_document(document, cfg)
    indices = list(range(info.page_count))
    previews = preview_pages(document, info, indices, cfg)
    decoded = decode_pages(document, info, indices, cfg)
    oversample = PDF_PREVIEW_OVERSAMPLE if info.kind == "pdf" else 1
    for preview, page in zip(previews, decoded, strict=True):
        assert preview.ndim == 2 and preview.size <= MARKS_PIXELS * oversample**2 * 1.01
        assert count_marks(preview) == pytest.approx(count_marks(page.image), rel=0.05, abs=2)


def test_a_page_too_costly_to_decode_twice_or_undecodable_has_no_preview():
    cfg = PreprocessConfig()
    huge = samples.blank_png(4000, 4000)  # 16 Mpx, not a JPEG
    info = inspect_document(huge, cfg)
    assert preview_pages(huge, info, [0], cfg) == [None]
    truncated = samples.truncated_jpeg()
    assert count_each(preview_pages(truncated, inspect_document(truncated, cfg), [0], cfg)) == [None]


@pytest.mark.parametrize("height, width", [(56, 392), (39, 445), (445, 39), (480, 640), (2200, 1700), (1176, 840)])
def test_the_detector_input_size_is_rapidocrs_own(height, width):
    """What :func:`detector_input_size` computes is what rapidocr's own steps make of the page."""
    ocr = RapidOCR(params={"Global.log_level": "warning"})
    image, record = ocr.preprocess_img(np.zeros((height, width, 3), np.uint8))
    image, _ = _vertical_padding(ocr, image, record)
    real = ocr._load_det_model().get_preprocess().resize(image).shape[:2]
    assert detector_input_size(height, width) == real
