"""Blank pages: found after decoding, answered without the engine, counted as such."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from ocrserve.config import PreprocessConfig
from ocrserve.preprocess import DecodeFailure, decode_pages, inspect_document
from ocrserve.preprocess.blank import MIN_INK_PIXELS, ink_pixels, is_blank
from tests import samples
from tests.conftest import DATA
from tests.jobs_util import engine_pages, metric

CFG = PreprocessConfig()
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"


def decoded(data: bytes, cfg: PreprocessConfig = CFG) -> list:
    info = inspect_document(data, cfg)
    return decode_pages(data, info, range(info.page_count), cfg)


def word_page(word: str, size: int, grey: int, page: tuple[int, int] = (1654, 2339)) -> Image.Image:
    """``word`` alone on a white page (A4 at 200 dpi by default), ``size`` px, in ``grey`` (0 black)."""
    image = Image.new("L", page, 255)
    font = ImageFont.truetype(FONT, size) if size else None
    ImageDraw.Draw(image).text((page[0] // 4, page[1] // 4), word, fill=grey, font=font)
    return image


def blank_tiff(pages: int, size: tuple[int, int] = (8, 8)) -> bytes:
    page = Image.new("1", size, 1)
    return samples.encode(page, "TIFF", save_all=True, append_images=[page] * (pages - 1))


def test_uniform_pages_are_blank_in_any_colour_and_format():
    for mode, colour, fmt in [("1", 1, "TIFF"), ("L", 255, "PNG"), ("RGB", (250, 248, 240), "JPEG"), ("L", 0, "PNG")]:
        (page,) = decoded(samples.encode(Image.new(mode, (1700, 2200), colour), fmt))
        assert page.blank and page.known_result().source == "blank", (mode, colour, fmt)
    (page,) = decoded(blank_tiff(1))  # 8 x 8, scaled up to the pixel budget's minimum
    assert page.blank and page.image.shape[:2] == (56, 56)


def test_a_single_short_word_is_not_blank_even_faint():
    """The faintest words the engine was seen to read (24 px, grey 220 on white: contrast 35) and two
    8 px black letters, which it cannot read, all stay above the threshold (module docstring)."""
    for word, size, grey in [("OK", 24, 220), ("to", 24, 220), ("to", 8, 0), ("Hi", 12, 160)]:
        (page,) = decoded(samples.encode(word_page(word, size, grey), "PNG"))
        assert not page.blank, (word, size, grey, ink_pixels(Image.fromarray(page.image)))
    colour = Image.new("RGB", (600, 200), (200, 60, 60))  # red text on a green of equal grey level
    ImageDraw.Draw(colour).text((40, 80), "same grey", fill=(90, 110, 20), font=ImageFont.truetype(FONT, 30))
    assert np.ptp(np.asarray(colour.convert("L"))) < 2 * 16 and not is_blank(colour)


def test_blank_check_can_be_turned_off():
    (page,) = decoded(blank_tiff(1), CFG.model_copy(update={"blank_check": False}))
    assert not page.blank and page.known_result() is None


def test_no_page_of_the_corpus_nor_the_examples_is_blank(corpus):
    """Every real page, faint scans and sparse maps included, has far more ink than the threshold
    (the fewest: ``ocrmypdf/crom.png``, one line on a 56 x 392 page)."""
    files = [corpus / entry["file"] for entry in json.loads((corpus / "index.json").read_text())]
    files += sorted((DATA.parent.parent / "examples").glob("*.tif"))
    fewest = []
    for path in files:
        for page in decoded(path.read_bytes()):
            assert not isinstance(page, DecodeFailure), path
            assert not page.blank, f"{path} page {page.index + 1}"
            fewest.append(ink_pixels(Image.fromarray(page.image)))
    assert len(fewest) >= 45 and min(fewest) > 100 * MIN_INK_PIXELS


def test_blank_pages_skip_the_engine_through_the_gateway(http):
    """A TIFF of blank pages around one page holding a single word: the blank ones come back with
    empty text, ``source: blank`` and no error, without the engine, and are counted in the usage
    and in ``ocrserve_blank_pages_total``; the word is read."""
    word = word_page("Hello", 40, 0, page=(640, 200)).convert("1")
    blank = Image.new("1", (8, 8), 1)
    tiff = samples.encode(blank, "TIFF", save_all=True, append_images=[blank, word, blank, blank])
    blank_before, engine_before = metric(http, "ocrserve_blank_pages_total"), engine_pages(http)
    response = http.post("/v1/ocr", files={"file": ("blank.tif", tiff)})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [p["source"] for p in body["pages"]] == ["blank", "blank", "ocr", "blank", "blank"]
    for page in body["pages"][:2] + body["pages"][3:]:
        assert (page["text"], page["lines"], page.get("error"), page["width"]) == ("", [], None, 8)
        assert page["timings"]["engine_s"] == 0
    assert "Hello" in body["pages"][2]["text"]
    assert body["usage"]["pages"] == 5 and body["usage"]["blank_pages"] == 4
    assert metric(http, "ocrserve_blank_pages_total") == blank_before + 4
    assert engine_pages(http) == engine_before + 1


@pytest.mark.parametrize("pages", [200])
def test_two_hundred_blank_pages_cost_no_engine_time(http, pages):
    """The hostile case: 200 blank 8 x 8 pages (a few KB) took 108 s of engine time; now none.
    Admission prices pages before they are decoded, when nothing says they are blank: the request
    gives itself the time 200 pages could take."""
    engine_before = engine_pages(http)
    response = http.post("/v1/ocr", files={"file": ("blank.tif", blank_tiff(pages))}, data={"timeout": "3600"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["blank_pages"] == pages and {p["source"] for p in body["pages"]} == {"blank"}
    assert engine_pages(http) == engine_before
    assert body["usage"]["seconds"] < 30
