#!/usr/bin/env python
"""Accuracy on the real-document corpus: the ocrserve REST API against rapidocr called directly.

Every document of ``../shared/corpus`` with whole-page ground truth (``gt_quality`` not
``partial``) is (a) sent to ``POST {url}/v1/ocr`` and (b) read by rapidocr directly with naive
loading (see :func:`naive_inputs`). Both texts are scored with :mod:`ocrserve.evaluation` (CER and
bag-of-words F1; the document's primary metric is marked). The script prints a per-document
table and the means, and exits 1 when the API's mean is worse than direct rapidocr's (or any API
request failed), 2 when the corpus or the server cannot be reached.

Examples::

    python scripts/eval_corpus.py                        # server on 127.0.0.1:8000
    python scripts/eval_corpus.py --url http://127.0.0.1:8123 --only 'sroie/*' --json out.json
    python scripts/eval_corpus.py --direct-only          # rapidocr alone, no server needed
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import pypdfium2
from PIL import Image
from rapidocr import RapidOCR
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ocrserve.evaluation import BAG_F1, CER, PAGE_BREAK, CorpusDocument, Score, load_index, locate_corpus, score
from ocrserve.extras import MissingExtra, require

PDF_DPI = 200
REQUEST_TIMEOUT_S = 900.0
TIFF_REDUCED_RESOLUTION = 0x1  # NewSubfileType (tag 254) bit 0: a reduced-resolution copy


@dataclass
class Side:
    """What one reader (the API or direct rapidocr) made of one document."""

    text: str
    pages: int
    seconds: float
    score: Score
    error: str | None = None


@dataclass
class Row:
    """One document's result for both readers (``api`` is None with ``--direct-only``)."""

    doc: str
    metric: str
    direct: Side
    api: Side | None = None


def naive_inputs(path: Path) -> list[str | np.ndarray]:
    """The inputs rapidocr gets for ``path``, one per page, loaded the way a plain user would.

    * PDF: each page rendered by pypdfium2 at 200 dpi (``/Rotate`` honoured by PDFium), taken as
      an RGB array and reversed to BGR, because rapidocr reads any 3-channel array as BGR.
    * Multi-frame TIFF: rapidocr's own loader reads only the first frame, so Pillow walks the
      frames (``Image.seek``), converts each to RGB and reverses it to BGR. Frames flagged as
      reduced-resolution copies (NewSubfileType bit 0, the levels of a pyramidal TIFF) are not
      pages and are skipped.
    * Anything else: the path itself, so rapidocr decodes it (and applies EXIF orientation) itself,
      with no other conversion: CMYK, alpha and palette images reach it as they are.
    """
    if path.suffix.lower() == ".pdf":
        return _pdf_pages(path)
    if path.suffix.lower() in (".tif", ".tiff"):
        frames = _tiff_frames(path)
        if len(frames) > 1:
            return frames
    return [str(path)]


def _pdf_pages(path: Path) -> list[np.ndarray]:
    """Every page of a PDF rendered at :data:`PDF_DPI` as a BGR array."""
    pdf = pypdfium2.PdfDocument(path)
    try:
        return [_rgb_to_bgr(page.render(scale=PDF_DPI / 72).to_pil()) for page in pdf]
    finally:
        pdf.close()


def _tiff_frames(path: Path) -> list[np.ndarray]:
    """Every full-resolution frame of a TIFF as a BGR array."""
    frames = []
    with Image.open(path) as image:
        for index in range(getattr(image, "n_frames", 1)):
            image.seek(index)
            if int(image.tag_v2.get(254, 0)) & TIFF_REDUCED_RESOLUTION:
                continue
            frames.append(_rgb_to_bgr(image))
    return frames


def _rgb_to_bgr(image: Image.Image) -> np.ndarray:
    """A Pillow image as the contiguous BGR uint8 array rapidocr expects."""
    return np.ascontiguousarray(np.asarray(image.convert("RGB"))[:, :, ::-1])


class DirectReader:
    """rapidocr with its default settings, called in this process on naively loaded pages."""

    def __init__(self) -> None:
        self.engine = RapidOCR(params={"Global.log_level": "error"})  # defaults otherwise; quiet

    def read_page(self, page: str | np.ndarray) -> str:
        """The text of one page: rapidocr's lines joined by newlines (empty when it finds none)."""
        return "\n".join(self.engine(page).txts or ())

    def read(self, document: CorpusDocument) -> Side:
        """Every page of ``document`` read and scored; pages joined by form feeds."""
        start = time.perf_counter()
        pages = [self.read_page(page) for page in naive_inputs(document.path)]
        text = PAGE_BREAK.join(pages)
        return Side(text, len(pages), time.perf_counter() - start, score(document, text))


def read_via_api(client: httpx.Client, url: str, document: CorpusDocument) -> Side:
    """``document`` sent to ``POST {url}/v1/ocr`` and its ``text`` scored.

    A failed request counts as empty text (CER 1, bag-F1 0) and carries its error.
    """
    start = time.perf_counter()
    try:
        with document.path.open("rb") as handle:
            response = client.post(f"{url}/v1/ocr", files={"file": (document.path.name, handle)})
        response.raise_for_status()
        body = response.json()
        text, pages, error = body["text"], len(body["pages"]), None
    except (httpx.HTTPError, KeyError, ValueError) as exc:
        text, pages, error = "", 0, _describe(exc)
    return Side(text, pages, time.perf_counter() - start, score(document, text), error)


def _describe(exc: Exception) -> str:
    """A one-line account of a failed request (problem detail where the server sent one)."""
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}: {exc.response.text[:200]}"
    return f"{type(exc).__name__}: {exc}"


def server_ready(url: str) -> bool:
    """True when ``GET {url}/readyz`` answers 200."""
    try:
        return httpx.get(f"{url}/readyz", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def evaluate(documents: list[CorpusDocument], url: str | None, console: Console) -> list[Row]:
    """Read every document through the API (unless ``url`` is None) and directly, with a progress bar."""
    direct = DirectReader()
    rows = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client, Progress(*columns, console=console) as progress:
        task = progress.add_task("documents", total=len(documents))
        for document in documents:
            progress.update(task, description=document.file)
            api = read_via_api(client, url, document) if url else None
            rows.append(Row(document.file, document.metric, direct.read(document), api))
            progress.advance(task)
    return rows


def summarize(sides: list[Side]) -> dict[str, float]:
    """Means over one reader's results: CER over CER documents, bag-F1 over all, and throughput."""
    cers = [s.score.cer for s in sides if s.score.metric == CER]
    pages, seconds = sum(s.pages for s in sides), sum(s.seconds for s in sides)
    return {
        "mean_cer": statistics.fmean(cers) if cers else float("nan"),
        "median_cer": statistics.median(cers) if cers else float("nan"),
        "mean_bag_f1": statistics.fmean(s.score.bag_f1 for s in sides),
        "cer_documents": len(cers),
        "documents": len(sides),
        "pages": pages,
        "pages_per_min": 60 * pages / seconds if seconds else float("nan"),
    }


def document_table(rows: list[Row]) -> Table:
    """Per-document scores; the primary metric of each document in bold, the other dimmed."""
    table = Table(title="Corpus accuracy (CER lower is better, bag-F1 higher is better)")
    table.add_column("doc", overflow="fold")
    table.add_column("pages")
    table.add_column("metric")
    readers = ("API", "direct") if rows and rows[0].api else ("direct",)
    for metric in ("CER", "bag-F1"):
        for reader in readers:
            table.add_column(f"{reader} {metric}", justify="right")
    for row in rows:
        sides = [row.api, row.direct] if row.api else [row.direct]
        cells = [_cell(s.score.cer, row.metric == CER) for s in sides]
        cells += [_cell(s.score.bag_f1, row.metric == BAG_F1) for s in sides]
        doc = row.doc if not (row.api and row.api.error) else f"{row.doc} [red](API error)[/]"
        table.add_row(doc, _pages(row), row.metric, *cells)
    return table


def _cell(value: float, primary: bool) -> str:
    """A score formatted for the table: bold when it is the document's primary metric."""
    return f"[bold]{value:.3f}[/]" if primary else f"[dim]{value:.3f}[/]"


def _pages(row: Row) -> str:
    """Page count, ``api/direct`` where the two readers disagree."""
    if row.api and row.api.pages != row.direct.pages:
        return f"{row.api.pages}/{row.direct.pages}"
    return str(row.direct.pages)


def summary_table(summaries: dict[str, dict[str, float]]) -> Table:
    """Means per reader."""
    table = Table(title="Means")
    for name in ("reader", "mean CER", "median CER", "mean bag-F1", "docs (CER/all)", "pages/min"):
        table.add_column(name, justify="right")
    for reader, s in summaries.items():
        table.add_row(
            reader,
            f"{s['mean_cer']:.3f}",
            f"{s['median_cer']:.3f}",
            f"{s['mean_bag_f1']:.3f}",
            f"{s['cer_documents']}/{s['documents']}",
            f"{s['pages_per_min']:.1f}",
        )
    return table


def api_worse(api: dict[str, float], direct: dict[str, float], tolerance: float) -> list[str]:
    """The ways the API's means fall short of direct rapidocr's by more than ``tolerance``."""
    failures = []
    if api["mean_cer"] > direct["mean_cer"] + tolerance:
        failures.append(f"mean CER {api['mean_cer']:.3f} > direct {direct['mean_cer']:.3f}")
    if api["mean_bag_f1"] < direct["mean_bag_f1"] - tolerance:
        failures.append(f"mean bag-F1 {api['mean_bag_f1']:.3f} < direct {direct['mean_bag_f1']:.3f}")
    return failures


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="ocrserve base URL")
    parser.add_argument("--corpus", type=Path, help="corpus directory (default: $OCRSERVE_CORPUS or ../shared/corpus)")
    parser.add_argument("--only", metavar="GLOB", help="only documents whose corpus path matches, e.g. 'sroie/*'")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write per-document results and means here")
    parser.add_argument("--direct-only", action="store_true", help="skip the API; read with rapidocr only")
    parser.add_argument("--tolerance", type=float, default=0.0, help="slack allowed before the API counts as worse")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)  # whole table when piped to a file
    try:
        require("eval", "scripts/eval_corpus.py (CER)")
    except MissingExtra as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    corpus = args.corpus or locate_corpus()
    if corpus is None or not (corpus / "index.json").is_file():
        console.print("[red]corpus not found[/]: pass --corpus or set OCRSERVE_CORPUS")
        return 2
    documents = [d for d in load_index(corpus) if d.scored and fnmatch.fnmatch(d.file, args.only or "*")]
    if not documents:
        console.print(f"[red]no scored documents match[/] {args.only!r}")
        return 2
    for document in documents:
        if not document.checksum_ok():
            console.print(f"[yellow]warning[/]: {document.file} does not match its sha256 in index.json")
    url = None if args.direct_only else args.url.rstrip("/")
    if url and not server_ready(url):
        console.print(f"[red]server not ready[/]: GET {url}/readyz did not answer 200")
        return 2

    rows = evaluate(documents, url, console)
    summaries = {"direct": summarize([r.direct for r in rows])}
    if url:
        summaries = {"API": summarize([r.api for r in rows]), **summaries}
    console.print(document_table(rows))
    console.print(summary_table(summaries))
    if args.json:
        args.json.write_text(json.dumps({"means": summaries, "documents": [asdict(r) for r in rows]}, indent=2))

    if not url:
        return 0
    failures = api_worse(summaries["API"], summaries["direct"], args.tolerance)
    errors = [r.doc for r in rows if r.api.error]
    if errors:
        failures.append(f"API failed on {len(errors)} document(s): {', '.join(errors)}")
    empty = [r.doc for r in rows if not r.api.error and not r.api.text.strip()]
    if empty:
        failures.append(f"API returned no text for {len(empty)} document(s): {', '.join(empty)}")
    for failure in failures:
        console.print(f"[red]FAIL[/] {failure}")
    if not failures:
        console.print("[green]OK[/] the API's means are no worse than direct rapidocr's")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
