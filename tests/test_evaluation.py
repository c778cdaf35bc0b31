"""Corpus metrics (CER, bag-of-words F1) on hand-computed cases, and corpus index loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ocrserve.evaluation import (
    BAG_F1,
    CER,
    CORPUS_ENV,
    CorpusDocument,
    bag_f1,
    cer,
    load_index,
    locate_corpus,
    normalize,
    score,
    tokens,
)
from tests.needs import corpus_missing

CORPUS = locate_corpus()
needs_corpus = pytest.mark.skipif(CORPUS is None, reason=corpus_missing())


# --- CER -------------------------------------------------------------------------------------


def test_cer_is_edit_distance_over_reference_length():
    # kitten -> sitting: substitute k->s, e->i, insert g: 3 edits over 7 reference characters.
    assert cer("kitten", "sitting") == pytest.approx(3 / 7)


def test_cer_of_identical_text_is_zero_and_of_empty_hypothesis_is_one():
    assert cer("phototest", "phototest") == 0.0
    assert cer("", "abcd") == 1.0
    assert cer("", "") == 0.0
    assert cer("x", "") == 1.0


def test_cer_is_unbounded_above_for_insertions():
    # "aaaa" against "a": three insertions over one reference character.
    assert cer("aaaa", "a") == 3.0


def test_cer_ignores_line_breaks_and_whitespace_runs():
    assert cer("The quick\nbrown  fox\fjumps", "The quick brown fox jumps") == 0.0
    # one missing space is one edit: "ab" vs "a b" over 3 characters.
    assert cer("ab", "a b") == pytest.approx(1 / 3)


def test_cer_is_case_sensitive_unless_asked():
    assert cer("Total", "TOTAL") == pytest.approx(4 / 5)
    assert cer("Total", "TOTAL", case_insensitive=True) == 0.0


def test_normalize_folds_full_width_forms():
    assert normalize("ＡＢ，１２") == "AB,12"
    assert cer("ＡＢ，", "AB,") == 0.0


# --- bag-of-words F1 ---------------------------------------------------------------------------


def test_bag_f1_ignores_order():
    assert bag_f1("sat the cat", "the cat sat") == 1.0


def test_bag_f1_counts_repeated_words_as_a_multiset():
    # hyp {the: 2, cat: 1}, ref {the, cat, sat, mat}: 2 matched; P = 2/3, R = 2/4, F1 = 4/7.
    assert bag_f1("the the cat", "the cat sat mat") == pytest.approx(4 / 7)


def test_bag_f1_strips_punctuation_from_word_ends():
    assert tokens("(614) 466- 5087 Dec 10 '98") == ["614", "466", "5087", "Dec", "10", "98"]
    assert tokens("e-mail ... U.S.A.") == ["e-mail", "U.S.A"]
    assert bag_f1("Hello, world!", "Hello world") == 1.0


def test_bag_f1_case():
    # only "world" matches: P = 1/2, R = 1/2.
    assert bag_f1("Hello world", "HELLO world") == pytest.approx(0.5)
    assert bag_f1("Hello world", "HELLO world", case_insensitive=True) == 1.0


def test_bag_f1_edge_cases():
    assert bag_f1("", "") == 1.0
    assert bag_f1("", "words here") == 0.0
    assert bag_f1("other", "words") == 0.0


# --- documents and the index -------------------------------------------------------------------


def _doc(file: str, gt_quality: str = "exact", gt: Path | None = Path("x.gt.txt")) -> CorpusDocument:
    return CorpusDocument(file=file, path=Path(file), gt_quality=gt_quality, gt_text_path=gt)


def test_primary_metric_follows_reading_order_reliability():
    assert _doc("scribeocr/table_02.png", "exact (word-level)").metric == BAG_F1
    assert _doc("funsd/funsd_1.png", "exact (entity-level, human annotated)").metric == BAG_F1
    assert _doc("ocrmypdf/baiona_gray.png", "transcribed (word-set)").metric == BAG_F1
    assert _doc("tesseract/phototest.tif").metric == CER
    assert _doc("sroie/sroie_001.jpg", "exact (line-level)").metric == CER


def test_only_sroie_is_case_insensitive_and_partial_is_not_scored():
    assert _doc("sroie/sroie_001.jpg").case_insensitive
    assert not _doc("tesseract/phototest.tif").case_insensitive
    assert not _doc("olmocr/a.pdf", "partial (unit-test facts)", gt=None).scored
    assert not _doc("olmocr/b.pdf", "partial (silver reference)").scored
    assert _doc("ocr-d/boston_cooking_a.jpg", "transcribed").scored


def _write_corpus(root: Path) -> Path:
    """A two-document corpus: one SROIE receipt with ground truth, one partial PDF."""
    (root / "sroie").mkdir(parents=True)
    (root / "sroie" / "r.jpg").write_bytes(b"not really a jpeg")
    (root / "sroie" / "r.gt.txt").write_text("TOTAL\n10.00\n", encoding="utf-8")
    entries = [
        {
            "file": "sroie/r.jpg",
            "gt": ["sroie/r.box.csv", "sroie/r.gt.txt"],
            "gt_quality": "exact (line-level)",
            "tags": ["receipt"],
            "license": "MIT",
            "lang": "en",
            "sha256": "0b7cd3f3fb2ad5bd3fd2e1ba5d1e5e9a2a3b4b0c1a5c6b1f1e9f5e0c6d7a8b9c",
        },
        {"file": "olmocr/p.pdf", "gt": ["olmocr/p.tests.jsonl"], "gt_quality": "partial (unit-test facts)"},
    ]
    (root / "index.json").write_text(json.dumps(entries), encoding="utf-8")
    return root


def test_load_index_reads_entries_and_finds_plain_text_ground_truth(tmp_path):
    corpus = _write_corpus(tmp_path / "corpus")
    receipt, pdf = load_index(corpus)
    assert receipt.file == "sroie/r.jpg"
    assert receipt.path == corpus / "sroie" / "r.jpg"
    assert receipt.gt_text_path == corpus / "sroie" / "r.gt.txt"
    assert receipt.tags == ("receipt",)
    assert receipt.scored and receipt.metric == CER and receipt.case_insensitive
    assert not receipt.checksum_ok()  # the recorded sha256 is not that of the bytes written
    assert pdf.gt_text_path is None and not pdf.scored
    # the receipt read as "Total 10.00": only case differs, and SROIE folds case.
    assert score(receipt, "Total\n10.00").cer == 0.0


def test_locate_corpus_prefers_the_environment(tmp_path, monkeypatch):
    corpus = _write_corpus(tmp_path / "elsewhere")
    monkeypatch.setenv(CORPUS_ENV, str(corpus))
    assert locate_corpus() == corpus
    monkeypatch.setenv(CORPUS_ENV, str(tmp_path / "missing"))
    assert locate_corpus() is None


def test_locate_corpus_defaults_to_shared_beside_the_repository(tmp_path, monkeypatch):
    monkeypatch.delenv(CORPUS_ENV, raising=False)
    repo = tmp_path / "main"
    repo.mkdir()
    assert locate_corpus(repo) is None
    corpus = _write_corpus(tmp_path / "shared" / "corpus")
    assert locate_corpus(repo) == corpus


# --- the real corpus ----------------------------------------------------------------------------


@pytest.mark.corpus
@needs_corpus
def test_real_corpus_index():
    documents = {d.file: d for d in load_index(CORPUS)}
    scored = [d for d in documents.values() if d.scored]
    assert len(documents) == 42 and len(scored) == 39
    assert all(d.path.is_file() for d in documents.values())
    assert all(d.gt_text_path.is_file() for d in scored)
    assert {d.file for d in documents.values() if not d.scored} == {
        "olmocr/multi_column_miss.pdf",
        "olmocr/discoverworld_crazy_table4.pdf",
        "olmocr/edgar-rotated90.pdf",
    }
    assert sum(d.metric == BAG_F1 for d in scored) == 11  # 6 scribeocr, 2 FUNSD, 3 word-set maps
    assert documents["tesseract/phototest.tif"].checksum_ok()


@pytest.mark.corpus
@needs_corpus
def test_real_ground_truth_pages_and_self_score():
    documents = {d.file: d for d in load_index(CORPUS)}
    tiff = documents["tika/testTIFF_multipage.tif"]
    assert len(tiff.ground_truth().split("\f")) == 2
    assert len(documents["ocrmypdf/cardinal.pdf"].ground_truth().split("\f")) == 4
    phototest = documents["tesseract/phototest.tif"]
    perfect = score(phototest, phototest.ground_truth())
    assert (perfect.cer, perfect.bag_f1, perfect.primary) == (0.0, 1.0, 0.0)
