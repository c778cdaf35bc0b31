"""Accuracy on the real-document corpus: loading it and scoring OCR text against its ground truth.

The corpus (``../shared/corpus``, see its README.md) holds page images and PDFs copied from public
repositories. ``index.json`` lists each file with its source, license, language, tags, sha256 and
ground-truth files; ``<name>.gt.txt`` is plain UTF-8 text, one text line per line, pages separated
by a form feed (U+000C). ``gt_quality`` says how far the ground truth can be trusted; ``partial``
ground truth (facts or headings only) is never scored.

Two metrics, both computed on the whole document (all pages):

* **CER**, character error rate: Levenshtein distance (insertions, deletions, substitutions, each
  costing 1) between hypothesis and reference, divided by the reference length (Morris et al.,
  "From WER and RIL to MER and WIL", 2004; the usual OCR definition, e.g. ocrevalUAtion, jiwer).
  It is unbounded above: a hypothesis with many extra characters can score above 1.
* **bag-of-words F1**: the multiset of normalized tokens of each side is compared regardless of
  order; precision = matched / hypothesis tokens, recall = matched / reference tokens, F1 their
  harmonic mean, where matched is the size of the multiset intersection.

Which one is *primary* for a document follows the corpus README: reading order is approximate in
the scribeocr and FUNSD ground truth and in the "word-set" transcriptions, so they are scored by
bag-of-words F1; everything else by CER. SROIE ground truth is upper case while the receipts are
not, so SROIE is compared case-insensitively.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

CORPUS_ENV = "OCRSERVE_CORPUS"
PAGE_BREAK = "\f"
CER = "cer"
BAG_F1 = "bag_f1"

_BAG_SCORED_SOURCES = ("scribeocr", "funsd")
_CASE_INSENSITIVE_SOURCES = ("sroie",)
_WHITESPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class CorpusDocument:
    """One corpus file and what ``index.json`` says about it.

    Attributes:
        file: path relative to the corpus root, e.g. ``"sroie/sroie_001.jpg"``; its first segment
            names the source collection.
        path: absolute path of the file.
        gt_quality: ``exact``, ``corrected``, ``transcribed`` or ``partial``, possibly qualified
            (``"exact (word-level)"``, ``"transcribed (word-set)"``).
        gt_text_path: the ``.gt.txt`` ground truth, or None where the source has none.
        tags: hard-case tags (``exif-rotated``, ``cmyk-jpeg``, ``multi-page``, ...).
        license, lang, sha256: as recorded in the index.
    """

    file: str
    path: Path
    gt_quality: str
    gt_text_path: Path | None
    tags: tuple[str, ...] = ()
    license: str = ""
    lang: str = ""
    sha256: str = ""

    @property
    def source(self) -> str:
        """The collection the file comes from (``"tesseract"``, ``"sroie"``, ...)."""
        return self.file.split("/", 1)[0]

    @property
    def scored(self) -> bool:
        """True when the ground truth is whole-page text that can be scored."""
        return self.gt_text_path is not None and not self.gt_quality.startswith("partial")

    @property
    def metric(self) -> str:
        """The primary metric: :data:`BAG_F1` where reading order is approximate, else :data:`CER`."""
        if self.source in _BAG_SCORED_SOURCES or "word-set" in self.gt_quality:
            return BAG_F1
        return CER

    @property
    def case_insensitive(self) -> bool:
        """True where ground truth and image differ in case by construction (SROIE)."""
        return self.source in _CASE_INSENSITIVE_SOURCES

    def ground_truth(self) -> str:
        """The ground-truth text, pages separated by form feeds."""
        if self.gt_text_path is None:
            raise ValueError(f"{self.file} has no .gt.txt ground truth")
        return self.gt_text_path.read_text(encoding="utf-8")

    def checksum_ok(self) -> bool:
        """True when the file's sha256 matches the index."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest() == self.sha256


@dataclass(frozen=True)
class Score:
    """Both metrics of one hypothesis against its document's ground truth."""

    cer: float
    bag_f1: float
    metric: str

    @property
    def primary(self) -> float:
        """The value of the document's primary metric."""
        return self.cer if self.metric == CER else self.bag_f1


def corpus_path(repo_root: Path | None = None) -> Path:
    """Where the corpus is looked for: ``$OCRSERVE_CORPUS``, else ``../shared/corpus`` beside the
    repository (``repo_root``, by default the one holding this package), there or not."""
    env = os.environ.get(CORPUS_ENV)
    if env:
        return Path(env)
    return (repo_root or Path(__file__).resolve().parent.parent).parent / "shared" / "corpus"


def locate_corpus(repo_root: Path | None = None) -> Path | None:
    """Where the corpus is (:func:`corpus_path`).

    Args:
        repo_root: the repository root; defaults to the one holding this package.

    Returns:
        The corpus directory (it holds ``index.json``), or None when it is absent.
    """
    candidate = corpus_path(repo_root)
    return candidate if (candidate / "index.json").is_file() else None


def load_index(corpus: Path) -> list[CorpusDocument]:
    """Every document listed in ``corpus/index.json``, in index order."""
    entries = json.loads((corpus / "index.json").read_text(encoding="utf-8"))
    return [_document(corpus, entry) for entry in entries]


def _document(corpus: Path, entry: dict) -> CorpusDocument:
    """One index entry as a :class:`CorpusDocument`; its ``.gt.txt`` is the entry's plain-text ground truth."""
    gt_text = next((g for g in entry.get("gt", []) if g.endswith(".gt.txt")), None)
    return CorpusDocument(
        file=entry["file"],
        path=corpus / entry["file"],
        gt_quality=entry["gt_quality"],
        gt_text_path=corpus / gt_text if gt_text else None,
        tags=tuple(entry.get("tags", ())),
        license=entry.get("license", ""),
        lang=entry.get("lang", ""),
        sha256=entry.get("sha256", ""),
    )


def normalize(text: str, *, case_insensitive: bool = False) -> str:
    """Text as compared by :func:`cer`: NFKC, whitespace runs (line and page breaks included)
    collapsed to one space, ends stripped; case-folded when asked.

    Line breaks carry no weight because engines split and merge lines differently from the
    transcriber; NFKC makes full-width and compatibility forms (common in CJK output) compare
    equal to their plain forms.
    """
    text = _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()
    return text.casefold() if case_insensitive else text


def tokens(text: str, *, case_insensitive: bool = False) -> list[str]:
    """Words as compared by :func:`bag_f1`: :func:`normalize`, split on whitespace, punctuation
    stripped from both ends of each word, empty words dropped."""
    words = (_strip_punctuation(w) for w in normalize(text, case_insensitive=case_insensitive).split(" "))
    return [w for w in words if w]


def _strip_punctuation(word: str) -> str:
    """``word`` without leading and trailing Unicode punctuation (categories P*)."""
    start, end = 0, len(word)
    while start < end and unicodedata.category(word[start]).startswith("P"):
        start += 1
    while end > start and unicodedata.category(word[end - 1]).startswith("P"):
        end -= 1
    return word[start:end]


def cer(hypothesis: str, reference: str, *, case_insensitive: bool = False) -> float:
    """Character error rate of ``hypothesis`` against ``reference`` after :func:`normalize`.

    ``edit_distance / len(reference)``; 0.0 when both are empty, 1.0 when only the reference is.

    Raises:
        ImportError: rapidfuzz is missing (``pip install 'ocrserve[eval]'``).
    """
    try:
        from rapidfuzz.distance import Levenshtein  # the eval extra: loading the index needs none
    except ImportError as exc:
        raise ImportError("scoring CER needs rapidfuzz: pip install 'ocrserve[eval]'") from exc
    hyp = normalize(hypothesis, case_insensitive=case_insensitive)
    ref = normalize(reference, case_insensitive=case_insensitive)
    if not ref:
        return 0.0 if not hyp else 1.0
    return Levenshtein.distance(hyp, ref) / len(ref)


def bag_f1(hypothesis: str, reference: str, *, case_insensitive: bool = False) -> float:
    """Order-insensitive F1 of the token multisets (see :func:`tokens`); 1.0 when both are empty."""
    hyp = Counter(tokens(hypothesis, case_insensitive=case_insensitive))
    ref = Counter(tokens(reference, case_insensitive=case_insensitive))
    if not hyp and not ref:
        return 1.0
    matched = sum((hyp & ref).values())
    if matched == 0:
        return 0.0
    precision = matched / sum(hyp.values())
    recall = matched / sum(ref.values())
    return 2 * precision * recall / (precision + recall)


def score(document: CorpusDocument, hypothesis: str) -> Score:
    """Both metrics of ``hypothesis`` (pages joined by form feeds) against ``document``'s ground truth."""
    reference = document.ground_truth()
    fold = document.case_insensitive
    return Score(
        cer=cer(hypothesis, reference, case_insensitive=fold),
        bag_f1=bag_f1(hypothesis, reference, case_insensitive=fold),
        metric=document.metric,
    )
