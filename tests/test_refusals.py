"""What cannot be right is refused: image data that ends early, a PDF's lying /Count read for its real
pages, a timeout shorter than any page takes. Hostile files are built here from valid ones."""

from __future__ import annotations

import struct
import zlib

import pytest
from PIL import Image, ImageDraw

from ocrserve.config import PreprocessConfig
from ocrserve.errors import UnsupportedMedia
from ocrserve.preprocess import DecodeFailure, decode_pages, inspect_document
from tests import samples
from tests.test_api import assert_problem

CFG = PreprocessConfig()


def text_image(size: tuple[int, int] = (600, 200)) -> Image.Image:
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((20, size[1] // 2 - 20), "Hello world", fill="black", font_size=40)
    return image


def jpeg_claiming(width: int, height: int) -> bytes:
    """A 600 x 200 JPEG whose frame header (SOF0) was patched to claim ``width x height``."""
    data = samples.encode(text_image(), "JPEG")
    sof = data.index(b"\xff\xc0")
    return data[: sof + 5] + struct.pack(">HH", height, width) + data[sof + 9 :]


def png_claiming(width: int, height: int) -> bytes:
    """A 600 x 200 PNG whose IHDR (CRC fixed) claims ``width x height``: its zlib stream is whole
    but holds 200 rows."""
    data = samples.encode(text_image(), "PNG")
    ihdr = b"IHDR" + struct.pack(">II", width, height) + data[24:29]
    return data[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + data[33:]


def decode_one(data: bytes):
    info = inspect_document(data, CFG)
    (page,) = decode_pages(data, info, [0], CFG)
    return page


def assert_ends_early(page, pattern: str) -> None:
    assert isinstance(page, DecodeFailure), "decoded, filled in"
    assert (page.problem.status, page.problem.slug) == (415, "truncated")
    assert page.problem.detail.startswith("page 1: image data ends early: ") and pattern in page.problem.detail, (
        page.problem.detail
    )


@pytest.mark.parametrize("size", [(20000, 7500), (12000, 12000), (6000, 2000)])
def test_jpeg_claiming_more_pixels_than_its_data_holds(size):
    """Refused below one bit of scan data per block; a smaller lie (600 x 2000 here) still decodes,
    its missing rows grey (libjpeg gives no sign of it through Pillow)."""
    assert_ends_early(decode_one(jpeg_claiming(*size)), f"the JPEG declares {size[0]} x {size[1]} pixels")


def test_honest_jpegs_pass_the_scan_data_floor():
    """The floor is one bit per 8 x 8 block: a uniform JPEG, the least data any image codes to, and
    a progressive one are far above it."""
    for data in [
        samples.encode(Image.new("L", (4000, 4000), 255), "JPEG"),
        samples.encode(Image.new("RGB", (3000, 2000), (250, 250, 250)), "JPEG", quality=5),
        samples.encode(text_image(), "JPEG", progressive=True, optimize=True),
        jpeg_claiming(600, 200),
    ]:
        assert not isinstance(decode_one(data), DecodeFailure)


def test_a_cut_jpeg_is_named_as_ending_early():
    data = samples.encode(text_image(), "JPEG")
    assert_ends_early(decode_one(data[: len(data) // 2]), "image file is truncated")


@pytest.mark.parametrize("size", [(600, 400), (12000, 12000)])
def test_png_claiming_more_rows_than_its_data_holds(size):
    """Pillow stopped at the end of the zlib stream and left the rows below black (600 x 400), or
    failed with a decoder message naming nothing (12000 x 12000)."""
    assert_ends_early(decode_one(png_claiming(*size)), f"the PNG declares {size[0]} x {size[1]} pixels")


def test_cut_and_interlaced_pngs():
    data = samples.encode(text_image(), "PNG")
    assert_ends_early(decode_one(data[: len(data) // 2]), "its image data holds")
    interlaced = samples.encode(text_image(), "PNG", interlace=1)  # Adam7: the row count differs
    assert not isinstance(decode_one(interlaced), DecodeFailure)


@pytest.mark.parametrize("compression", [None, "tiff_lzw", "tiff_deflate", "packbits"])
def test_cut_tiffs_end_early(compression):
    """A TIFF cut in half: raw strips run past the end; a writer that puts the directory last (libtiff,
    for compressed strips) leaves a file Pillow could not identify ("not a supported document")."""
    data = samples.encode(text_image(), "TIFF", compression=compression)
    cut = data[: len(data) // 2]
    try:
        page = decode_one(cut)
    except UnsupportedMedia as problem:
        assert problem.slug == "truncated" and "first image directory is at byte" in problem.detail
    else:
        assert_ends_early(page, "past the end of the file")
    assert not isinstance(decode_one(data), DecodeFailure)


def test_jpeg_claiming_20000_by_7500_through_the_gateway(http):
    response = http.post("/v1/ocr", files={"file": ("patched.jpg", jpeg_claiming(20000, 7500))})
    body = assert_problem(response, 415, r"^page 1: image data ends early: the JPEG declares 20000 x 7500 pixels")
    assert body["type"].endswith("/truncated")


PAGE = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"
CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"


def pdf_counting(count: bytes, pages: int = 1) -> bytes:
    kids = b" ".join(b"%d 0 R" % (3 + i) for i in range(pages))
    return samples.raw_pdf(CATALOG, b"<< /Type /Pages /Kids [" + kids + b"] /Count " + count + b" >>", *[PAGE] * pages)


@pytest.mark.parametrize("count", [b"0", b"-1", b"2147483648", b"2", b"150", b"1048575"])
def test_a_lying_page_count_reads_the_real_pages(count):
    """PDFium trusts a /Count in 1..2^20-1 and walks the page tree otherwise: a one-page PDF was read
    under /Count 0, -1 and 2^31 and refused under 2 and 150. Now every lie reads the one page."""
    info = inspect_document(pdf_counting(count), CFG)
    assert (info.page_count, info.sizes) == (1, ((1700, 2200),))
    assert not isinstance(decode_one(pdf_counting(count)), DecodeFailure)
    three = inspect_document(pdf_counting(count, pages=3), CFG)
    assert three.page_count == (2 if count == b"2" else 3)  # /Count 2 of 3: PDFium looks up no third


def test_a_lying_page_count_is_not_a_page_limit():
    """/Count 150 on one page under max_document_pages=100: one page, not 413 for 150."""
    info = inspect_document(pdf_counting(b"150"), CFG.model_copy(update={"max_document_pages": 100}))
    assert info.page_count == 1


@pytest.mark.parametrize("count", [b"0", b"-1", b"2147483648", b"2", b"150"])
def test_lying_page_counts_through_the_gateway(http, count):
    response = http.post("/v1/ocr", files={"file": ("count.pdf", pdf_counting(count))})
    assert response.status_code == 200, response.text
    (page,) = response.json()["pages"]
    assert (page["width"], page["height"], page["source"], page.get("error")) == (1700, 2200, "blank", None)


@pytest.mark.parametrize("timeout", ["0.000001", "0.0009"])
def test_a_timeout_shorter_than_any_page_is_a_400(http, timeout):
    """It was a 503 "retry in 1 s": no retry could help."""
    response = http.post(
        "/v1/ocr", files={"file": ("a.png", samples.encode(text_image(), "PNG"))}, data={"timeout": timeout}
    )
    body = assert_problem(
        response, 400, rf"timeout={float(timeout):g} s is shorter than any page takes \(at least 0.001 s"
    )
    assert "retry-after" not in response.headers and "retry" not in body["detail"]
    jobs = http.post("/v1/jobs", files={"file": ("a.png", b"x")}, data={"timeout": timeout})
    assert_problem(jobs, 400, "shorter than any page takes")
