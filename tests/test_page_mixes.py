"""The page mixes of ``scripts/many_clients.py`` (:mod:`ocrserve.bench.page_mixes`): a mix is its
seed, the corpus split is stable and disjoint, and the document is a PDF the gateway's own
preprocessing reads at the sizes the mix reports. Skipped where the corpus is absent."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from ocrserve.bench.page_mixes import (
    MIXES,
    PHOTOTEST,
    POOLS,
    SPLITS,
    CorpusMissing,
    build_mix,
    copies,
    from_file,
    split_of,
)
from ocrserve.config import PreprocessConfig
from ocrserve.evaluation import load_index, locate_corpus
from ocrserve.preprocess import DecodeFailure, decode_pages, inspect_document
from tests.needs import corpus_missing

CORPUS = locate_corpus()
needs_corpus = pytest.mark.skipif(CORPUS is None, reason=corpus_missing())
#: The mixes built from the corpus (all but phototest).
CORPUS_MIXES = [m for m in MIXES if m != "phototest"]


def gateway_reads(mix, pages: int) -> None:
    """The mix's document is a ``pages``-page PDF whose page sizes at the default ``pdf_dpi`` are
    the ones the mix reports."""
    info = inspect_document(mix.document, PreprocessConfig())
    assert info.kind == "pdf" and info.page_count == pages
    assert info.sizes == tuple((p.width, p.height) for p in mix.pages)
    assert sum(kind["pages"] for kind in mix.by_kind().values()) == pages


def test_phototest_needs_no_corpus():
    mix = build_mix("phototest", 3, corpus=None)
    gateway_reads(mix, 3)
    assert {(p.width, p.height) for p in mix.pages} == {(1280, 960)}  # 640 x 480 at 100 dpi, as ever


@pytest.mark.parametrize("name", CORPUS_MIXES)
def test_a_corpus_mix_without_the_corpus_names_its_variable(name):
    with pytest.raises(CorpusMissing, match="OCRSERVE_CORPUS"):
        build_mix(name, 1, corpus=None)


def test_the_split_rule_is_pinned():
    """Moving a file across the split would put pages tuned on into the report."""
    assert split_of("sroie/sroie_019.jpg") == "dev"
    assert split_of("scribeocr/receipt_03.png") == "held-out"
    assert split_of("scribeocr/singlecol_01.png") == "held-out"
    assert split_of("ocrmypdf/linn.png") == "dev"


@needs_corpus
def test_the_split_is_disjoint_and_covers_the_corpus():
    files = {d.file for d in load_index(CORPUS)}
    sides = {side: {f for f in files if split_of(f) == side} for side in SPLITS}
    assert all(sides.values())
    assert not sides["dev"] & sides["held-out"]
    assert sides["dev"] | sides["held-out"] == files


@needs_corpus
@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize("name", POOLS)
def test_every_mix_has_corpus_pages_on_each_side(name, split):
    indexed = {d.file for d in load_index(CORPUS)}
    assert [f for f in POOLS[name] if f in indexed and split_of(f) == split]


@needs_corpus
@pytest.mark.parametrize("name", CORPUS_MIXES)
def test_a_mix_is_its_seed(name):
    first = build_mix(name, 2, seed=5, corpus=CORPUS)
    assert build_mix(name, 2, seed=5, corpus=CORPUS).document == first.document
    other = build_mix(name, 2, seed=6, corpus=CORPUS)
    assert other.document != first.document
    gateway_reads(first, 2)


@needs_corpus
@pytest.mark.parametrize("split", SPLITS)
def test_corpus_pages_come_from_their_side(split):
    mix = build_mix("mixed", 10, split=split, seed=3, corpus=CORPUS)
    gateway_reads(mix, 10)
    sources = {p.source for p in mix.pages} - {"synthetic"}
    assert sources
    assert {split_of(s) for s in sources} == {split}


@needs_corpus
def test_scans_render_at_the_gateway():
    """1-bit, grayscale and colour pages of one document all decode through the gateway's code."""
    mix = build_mix("scans", 4, seed=2, corpus=CORPUS)
    cfg = PreprocessConfig()
    info = inspect_document(mix.document, cfg)
    pages = decode_pages(mix.document, info, range(info.page_count), cfg)
    assert not [p for p in pages if isinstance(p, DecodeFailure)]


@needs_corpus
def test_a_file_is_posted_as_it_is():
    path = CORPUS / "ocrmypdf" / "cardinal.pdf"
    mix = from_file(path)
    assert mix.document == path.read_bytes()
    assert len(mix.pages) == inspect_document(path, PreprocessConfig()).page_count > 1
    assert mix.as_dict()["by_kind"]["file"]["pages"] == len(mix.pages)


def test_copies_of_a_page_differ_in_bytes_not_in_pixels():
    """Each copy is a PNG of the page's own pixels with bytes of its own (so the gateway's count
    kept by content never prices the next post)."""
    pages = copies(PHOTOTEST.read_bytes())
    first, second = next(pages), next(pages)
    assert first != second
    original = Image.open(PHOTOTEST)
    for data in (first, second):
        copy = Image.open(io.BytesIO(data))
        assert copy.format == "PNG" and copy.size == original.size
        assert copy.tobytes() == original.convert(copy.mode).tobytes()
