"""Page mixes: the document a many-clients benchmark posts, built from pages the gateway was not
tuned on (``scripts/many_clients.py --mix``).

A mix is ``pages`` pages drawn with ``random.Random(seed)`` and written as one PDF at
:data:`PDF_DPI` (the gateway's default ``preprocess.pdf_dpi``), so a page of W x H pixels here is a
W x H page to the gateway before its pixel budget:

- ``phototest``: copies of ``tests/data/phototest.tif`` at 100 dpi (1280 x 960 at the gateway),
  the script's original document; split and seed do not apply, and it needs no corpus.
- ``dense``: each page, with even odds, a synthetic letter page (:data:`SYNTHETIC_SIZE`,
  paragraphs of words from the split's English ground truth in PIL's default font at
  :data:`FONT_SIZE` px, about 8 pt at 200 dpi) or a real dense page (:data:`DENSE_FILES`).
- ``receipts``: the corpus receipts, each scaled by a factor from :data:`RECEIPT_SCALE`.
- ``cjk``: the Chinese pages, each scaled by a factor from :data:`CJK_SCALE` (no CJK font is
  installed, so none is rendered).
- ``scans``: real scans re-rendered at one of :data:`SCAN_DPIS` dots per inch (scaled from their
  own resolution, :func:`native_dpi`), each kept as scanned, made grayscale or made 1-bit.
- ``rotated``: text pages turned 0, 90, 180 or 270 degrees counter-clockwise.
- ``mixed``: each page a draw of one of the five above.

Corpus pages come from one side of a split (:func:`split_of`): tune on ``dev``, report on
``held-out``. Synthetic pages and every draw follow the seed; the same mix, pages, split and seed
give the same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import io
import itertools
import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont, ImageOps
from PIL.PngImagePlugin import PngInfo

from ocrserve.bench.harness import REPO
from ocrserve.config import PreprocessConfig
from ocrserve.evaluation import CORPUS_ENV, corpus_path, load_index
from ocrserve.preprocess import inspect_document

#: Every mix :func:`build_mix` knows, the default first.
MIXES = ("phototest", "dense", "receipts", "cjk", "scans", "rotated", "mixed")
#: The mixes a ``mixed`` page is drawn from.
DRAWN_MIXES = ("dense", "receipts", "cjk", "scans", "rotated")
#: The two sides of the corpus (:func:`split_of`).
SPLITS = ("dev", "held-out")
#: Resolution the PDF is written at, dots per inch: the gateway's default ``preprocess.pdf_dpi``.
PDF_DPI = 200
#: The ``phototest`` page and the resolution the script always posted it at.
PHOTOTEST = REPO / "tests" / "data" / "phototest.tif"
PHOTOTEST_DPI = 100
#: A synthetic dense page, ``(width, height)`` px: US letter at 200 dpi.
SYNTHETIC_SIZE = (1700, 2200)
#: The synthetic page's font size, px (PIL's default font), and its margins, px.
FONT_SIZE = 22
MARGIN = 100
#: Lines a synthetic paragraph has, ``(fewest, most)``; a blank line separates paragraphs.
PARAGRAPH_LINES = (4, 12)
#: Share of ``dense`` pages that are synthetic; the others are :data:`DENSE_FILES`.
SYNTHETIC_SHARE = 0.5
#: Scale factors a receipt or a Chinese page is drawn with, ``(low, high)``.
RECEIPT_SCALE = (0.8, 1.25)
CJK_SCALE = (0.75, 1.5)
#: Resolutions a scan is re-rendered at, dpi.
SCAN_DPIS = (100, 150, 200, 300)
#: What a re-rendered scan becomes.
SCAN_MODES = ("as scanned", "grayscale", "1-bit")
#: Resolutions image software writes by default (no scanner's): a file saying one says nothing.
DEFAULT_DPIS = (72, 96)
#: Turns of a ``rotated`` page, degrees counter-clockwise.
ROTATIONS = (0, 90, 180, 270)

#: Corpus files of each mix, relative to the corpus root (its README lists them).
DENSE_FILES = (
    "tesseract/unlv_8071_093.3B.tif",
    "ocrmypdf/linn.png",
    "scribeocr/singlecol_01.png",
    "scribeocr/filing_01.png",
    "scribeocr/table_02.png",
    "scribeocr/table_08.png",
    "scribeocr/multicol_05.jpg",
)
RECEIPT_FILES = ("sroie/sroie_019.jpg", "sroie/sroie_001.jpg", "sroie/sroie_017.jpg", "scribeocr/receipt_03.png")
CJK_FILES = (
    "rapidocr/img_exif_orientation.jpg",
    "rapidocr/black_font_color_transparent.png",
    "rapidocr/test_without_det.jpg",
    "rapidocr/text_vertical_words.png",
    "cnocr/multi-line_cn1.png",
)
SCAN_FILES = (
    "tesseract/unlv_8071_093.3B.tif",
    "ocrmypdf/linn.png",
    "ocr-d/kant_aufklaerung_1784_0017.tif",
    "scribeocr/table_08.png",
    "sroie/sroie_019.jpg",
    "sroie/sroie_001.jpg",
    "sroie/sroie_017.jpg",
    "funsd/funsd_82092117.png",
    "funsd/funsd_82253362_3364.png",
)
TEXT_FILES = (
    "tesseract/phototest.tif",
    "tesseract/eurotext.tif",
    "tesseract/unlv_8071_093.3B.tif",
    "ocrmypdf/linn.png",
    "scribeocr/singlecol_01.png",
    "scribeocr/filing_01.png",
    "scribeocr/table_08.png",
    "scribeocr/multicol_05.jpg",
    "funsd/funsd_82092117.png",
    "funsd/funsd_82253362_3364.png",
)
POOLS = {"dense": DENSE_FILES, "receipts": RECEIPT_FILES, "cjk": CJK_FILES, "scans": SCAN_FILES, "rotated": TEXT_FILES}


class CorpusMissing(RuntimeError):
    """A mix needs the corpus and there is none; the message names :data:`CORPUS_ENV`."""


@dataclass(frozen=True)
class MixPage:
    """One page of a mix.

    Attributes:
        kind: what the page is: ``synthetic text``, ``dense page``, ``receipt``, ``cjk``, ``scan``,
            ``turned page``, ``phototest`` or ``file``.
        source: the corpus file (relative to its root), ``synthetic``, or the posted file's name.
        detail: how it was made from the source (``x1.23``, ``150 dpi, 1-bit``, ``turned 90``).
        width, height: its pixels at the gateway (a PDF page at 200 dpi).
    """

    kind: str
    source: str
    detail: str
    width: int
    height: int

    @property
    def pixels(self) -> int:
        return self.width * self.height


def copies(data: bytes) -> Iterator[bytes]:
    """Endless copies of the image ``data``, each with bytes of its own: its pixels as a PNG with a
    running number in a text chunk (``ocrserve-copy``). The gateway keeps the line units it counted
    on a page's preview by the page's content, so a client posting one page again and again would
    have every post after the first priced without a count, where the pages a real client sends
    are each new to it: a benchmark's stream of single pages posts copies."""
    image = Image.open(io.BytesIO(data))
    image.load()
    for number in itertools.count():
        info = PngInfo()
        info.add_text("ocrserve-copy", str(number))
        out = io.BytesIO()
        image.save(out, "PNG", pnginfo=info)
        yield out.getvalue()


@dataclass(frozen=True)
class PageMix:
    """The document of a mix and what its pages are.

    Attributes:
        name: the mix (:data:`MIXES`), or ``file``.
        split: the corpus side its corpus pages come from; ``""`` where none do.
        seed: the seed of its draws; None for a file.
        pages: its pages in order.
        document: the bytes to post (a PDF, or the file as it is).
        filename: the name to post it under.
    """

    name: str
    split: str
    seed: int | None
    pages: tuple[MixPage, ...]
    document: bytes
    filename: str

    def by_kind(self) -> dict[str, dict]:
        """``{kind: {"pages": n, "megapixels": total, "smallest": "WxH", "largest": "WxH"}}`` in
        order of first appearance."""
        kinds: dict[str, list[MixPage]] = {}
        for page in self.pages:
            kinds.setdefault(page.kind, []).append(page)
        return {
            kind: {
                "pages": len(pages),
                "megapixels": round(sum(p.pixels for p in pages) / 1e6, 2),
                "smallest": _size(min(pages, key=lambda p: p.pixels)),
                "largest": _size(max(pages, key=lambda p: p.pixels)),
            }
            for kind, pages in kinds.items()
        }

    def summary(self) -> str:
        """One line: the mix, then pages, megapixels and sizes by kind."""
        where = f", {self.split} split, seed {self.seed}" if self.split else ""
        parts = []
        for kind, figures in self.by_kind().items():
            sizes = figures["smallest"]
            if figures["largest"] != sizes:
                sizes += f" .. {figures['largest']}"
            parts.append(f"{kind}: {_pages(figures['pages'])} ({figures['megapixels']:g} Mpx, {sizes})")
        total = sum(p.pixels for p in self.pages) / 1e6
        return f"{self.name}{where}: {_pages(len(self.pages))}, {total:.1f} Mpx: " + "; ".join(parts)

    def as_dict(self) -> dict:
        """Everything but the document's bytes (their count instead), for a JSON report."""
        return {
            "mix": self.name,
            "split": self.split,
            "seed": self.seed,
            "filename": self.filename,
            "bytes": len(self.document),
            "pages": len(self.pages),
            "megapixels": round(sum(p.pixels for p in self.pages) / 1e6, 2),
            "by_kind": self.by_kind(),
            "page_list": [asdict(p) for p in self.pages],
        }


def _size(page: MixPage) -> str:
    return f"{page.width}x{page.height}"


def _pages(count: int) -> str:
    """``1 page``, ``2 pages``."""
    return f"{count} page{'s' * (count != 1)}"


def split_of(file: str) -> str:
    """The side of the split a corpus file is on: ``dev`` where the first byte of the sha256 of its
    path relative to the corpus root (``"sroie/sroie_001.jpg"``) is even, else ``held-out``.

    Stable for as long as the path is; chosen over the last byte, which left no receipt on ``dev``.
    """
    return "dev" if hashlib.sha256(file.encode()).digest()[0] % 2 == 0 else "held-out"


def build_mix(name: str, pages: int, *, split: str = "held-out", seed: int = 1, corpus: Path | None = None) -> PageMix:
    """The ``pages``-page PDF of the mix ``name`` (see the module's docstring).

    Args:
        corpus: the corpus root (``locate_corpus()``); None where there is none.

    Raises:
        CorpusMissing: the mix needs the corpus and ``corpus`` is None.
        ValueError: an unknown mix or split, ``pages`` < 1, or no corpus file of the mix on the split.
    """
    if name not in MIXES:
        raise ValueError(f"unknown mix {name!r}; one of {', '.join(MIXES)}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; one of {', '.join(SPLITS)}")
    if pages < 1:
        raise ValueError(f"pages={pages}: at least 1")
    if name == "phototest":
        return _phototest(pages)
    if corpus is None:
        raise CorpusMissing(f"the {name} mix needs the corpus: none at {corpus_path()}; set {CORPUS_ENV} to its folder")
    sources = _Sources(corpus, split)
    rng = random.Random(seed)
    drawn = [_draw(name, rng, sources) for _ in range(pages)]
    return PageMix(
        name, split, seed, tuple(page for page, _ in drawn), _pdf([i for _, i in drawn], PDF_DPI), f"{name}.pdf"
    )


def from_file(path: Path) -> PageMix:
    """A file posted as it is, its pages as the gateway counts them (``inspect_document`` with the
    default ``preprocess`` settings: PDF pages at 200 dpi).

    Raises:
        OSError: it cannot be read.
        ocrserve.errors.ProblemError: the gateway could not read it either.
    """
    data = path.read_bytes()
    info = inspect_document(data, PreprocessConfig())
    pages = tuple(MixPage("file", path.name, info.kind, w, h) for w, h in info.sizes)
    return PageMix("file", "", None, pages, data, path.name)


def _phototest(pages: int) -> PageMix:
    image = Image.open(PHOTOTEST).convert("RGB")
    scale = PDF_DPI / PHOTOTEST_DPI
    page = MixPage("phototest", "tests/data/phototest.tif", "", round(image.width * scale), round(image.height * scale))
    return PageMix("phototest", "", None, (page,) * pages, _pdf([image] * pages, PHOTOTEST_DPI), "phototest.pdf")


def _pdf(images: list[Image.Image], resolution: float) -> bytes:
    """``images`` as the pages of one PDF at ``resolution`` dpi, with no dates in it (same pages,
    same bytes)."""
    out = io.BytesIO()
    images[0].save(
        out,
        "PDF",
        save_all=True,
        append_images=images[1:],
        resolution=resolution,
        creationDate=None,
        modDate=None,
    )
    return out.getvalue()


class _Sources:
    """The corpus files of one side of the split, and the words of its English ground truth."""

    def __init__(self, corpus: Path, split: str):
        self.corpus, self.split = corpus, split
        self.documents = [d for d in load_index(corpus) if split_of(d.file) == split]

    def pool(self, mix: str) -> list[str]:
        """The files of ``mix`` on this side, in :data:`POOLS` order."""
        here = {d.file for d in self.documents}
        files = [f for f in POOLS[mix] if f in here]
        if not files:
            raise ValueError(f"no {mix} page on the {self.split} side of {self.corpus}")
        return files

    def image(self, file: str) -> Image.Image:
        """A copy of the corpus image (:func:`_corpus_image`): saving one sets state on it."""
        return _corpus_image(str(self.corpus / file)).copy()

    @functools.cached_property
    def words(self) -> list[str]:
        """Words of the side's English ground truth, in index order, as often as they occur."""
        words = []
        for document in self.documents:
            if document.lang.startswith("en") and document.scored:
                words += [w for w in document.ground_truth().split() if w.isascii() and w.isprintable()]
        if not words:
            raise ValueError(f"no English ground truth on the {self.split} side of {self.corpus}")
        return words


def _draw(mix: str, rng: random.Random, sources: _Sources) -> tuple[MixPage, Image.Image]:
    if mix == "mixed":
        mix = rng.choice(DRAWN_MIXES)
    return _MAKERS[mix](rng, sources)


def _dense(rng: random.Random, sources: _Sources) -> tuple[MixPage, Image.Image]:
    if rng.random() < SYNTHETIC_SHARE:
        image = synthetic_page(rng, sources.words)
        return MixPage("synthetic text", "synthetic", f"{FONT_SIZE}-px text", *image.size), image
    file = rng.choice(sources.pool("dense"))
    image = sources.image(file)
    return MixPage("dense page", file, "as is", *image.size), image


def _scaled(kind: str, mix: str, scale: tuple[float, float]) -> Callable:
    def make(rng: random.Random, sources: _Sources) -> tuple[MixPage, Image.Image]:
        file = rng.choice(sources.pool(mix))
        factor = rng.uniform(*scale)
        image = _resize(sources.image(file), factor)
        return MixPage(kind, file, f"x{factor:.2f}", *image.size), image

    return make


def _scan(rng: random.Random, sources: _Sources) -> tuple[MixPage, Image.Image]:
    file = rng.choice(sources.pool("scans"))
    dpi, mode = rng.choice(SCAN_DPIS), rng.choice(SCAN_MODES)
    original = sources.image(file)
    image = _resize(original, dpi / native_dpi(original))
    if mode == "grayscale":
        image = image.convert("L")
    elif mode == "1-bit" and image.mode != "1":
        image = image.convert("L").convert("1", dither=Image.Dither.NONE)
    return MixPage("scan", file, f"{dpi} dpi, {mode}", *image.size), image


def _turned(rng: random.Random, sources: _Sources) -> tuple[MixPage, Image.Image]:
    file = rng.choice(sources.pool("rotated"))
    angle = rng.choice(ROTATIONS)
    image = sources.image(file)
    if angle:
        image = image.transpose(_TRANSPOSE[angle])
    return MixPage("turned page", file, f"turned {angle}", *image.size), image


_TRANSPOSE = {90: Image.Transpose.ROTATE_90, 180: Image.Transpose.ROTATE_180, 270: Image.Transpose.ROTATE_270}
_MAKERS = {
    "dense": _dense,
    "receipts": _scaled("receipt", "receipts", RECEIPT_SCALE),
    "cjk": _scaled("cjk", "cjk", CJK_SCALE),
    "scans": _scan,
    "rotated": _turned,
}


def synthetic_page(rng: random.Random, words: list[str]) -> Image.Image:
    """A grayscale :data:`SYNTHETIC_SIZE` page full of small text: paragraphs of
    :data:`PARAGRAPH_LINES` lines of words drawn from ``words``, in PIL's default font at
    :data:`FONT_SIZE` px, :data:`MARGIN` px from every edge."""
    font = _font()
    image = Image.new("L", SYNTHETIC_SIZE, 255)
    draw = ImageDraw.Draw(image)
    width, height = SYNTHETIC_SIZE
    line_height = round(FONT_SIZE * 1.3)
    y, left = MARGIN, rng.randint(*PARAGRAPH_LINES)
    while y + line_height <= height - MARGIN:
        draw.text((MARGIN, y), _line(rng, words, font, width - 2 * MARGIN), fill=0, font=font)
        y, left = y + line_height, left - 1
        if left == 0:
            y, left = y + line_height, rng.randint(*PARAGRAPH_LINES)
    return image


def _line(rng: random.Random, words: list[str], font, width: int) -> str:
    """Words drawn from ``words`` for as long as they fit in ``width`` px (at least one)."""
    line = rng.choice(words)
    while True:
        longer = f"{line} {rng.choice(words)}"
        if font.getlength(longer) > width:
            return line
        line = longer


@functools.cache
def _font():
    """PIL's default font at :data:`FONT_SIZE` px (its fixed-size bitmap font without FreeType)."""
    try:
        return ImageFont.load_default(size=FONT_SIZE)
    except ImportError:
        return ImageFont.load_default()


def native_dpi(image: Image.Image) -> float:
    """The resolution a scan was made at: what the file says, unless it says nothing or a software
    default (:data:`DEFAULT_DPIS`); then its longer side over 11 inches (a letter page)."""
    dpi = image.info.get("dpi", (0, 0))[0]
    if dpi and round(dpi) not in DEFAULT_DPIS:
        return float(dpi)
    return max(image.size) / 11


def _resize(image: Image.Image, factor: float) -> Image.Image:
    size = (max(16, round(image.width * factor)), max(16, round(image.height * factor)))
    if image.mode == "1":  # through grayscale: a 1-bit image resizes by nearest neighbour only
        return image.convert("L").resize(size, Image.Resampling.LANCZOS).convert("1", dither=Image.Dither.NONE)
    return image.resize(size, Image.Resampling.LANCZOS)


@functools.cache
def _corpus_image(path: str) -> Image.Image:
    """The first frame of a corpus image, EXIF orientation applied, in a mode a PDF holds as is
    (1-bit, grayscale or RGB; alpha flattened on white). Cached: do not change it in place."""
    with Image.open(path) as opened:
        image = ImageOps.exif_transpose(opened)
        dpi = opened.info.get("dpi")
    if image.mode in ("RGBA", "LA", "P", "PA"):
        rgba = image.convert("RGBA")
        image = Image.new("RGB", rgba.size, "white")
        image.paste(rgba, mask=rgba.getchannel("A"))
    elif image.mode not in ("1", "L", "RGB"):
        image = image.convert("RGB")
    if dpi:
        image.info["dpi"] = dpi
    return image
