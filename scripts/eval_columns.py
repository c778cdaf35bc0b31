#!/usr/bin/env python
"""Reading order on generated multi-column pages (:mod:`ocrserve.bench.columns`) or on the shared
corpus: CER per layout kind (or per document), with or without the layout model.

Every page of ``page_set(--seed, --per-kind)`` (of each ``--kind``) is encoded as PNG, decoded as the gateway decodes it
(the local profile's preprocess settings) and read by the embedded engine in this process, one page
at a time. The script prints each page's CER and timings, then per kind the mean CER and the mean
milliseconds a page spent in detection (``det_s``), in the layout model (``layout_model_s``) and in
recognition. Seed 1 is the development set; the held-out set is scored with another seed, once, at
the end (docs/reading-order.md).

``--compare`` scores both orders from one pass: the engine runs with ``layout_model: true`` and
each page's lines (the engine's call of :func:`ocrserve.layout.arrange`, recorded) are ordered
again without the regions, which is what the engine does with the model off (its lines are the
same either way: the model adds regions after detection and changes no box or crop).

``--corpus`` reads the shared corpus's documents with whole-page ground truth instead (each file
decoded by the local profile's preprocess, a PDF page with its own text layer or a blank page
taken as the gateway takes it, without OCR) and scores each with its primary metric
(:func:`ocrserve.evaluation.score`: CER, or bag-of-words F1 where the order is approximate).

Examples::

    python scripts/eval_columns.py --seed 1                     # development set, engine defaults
    python scripts/eval_columns.py --seed 1 --set layout_model=true --json after.json
    python scripts/eval_columns.py --seed 2 --compare --json heldout.json   # both orders, one pass
    python scripts/eval_columns.py --corpus --compare --json corpus.json
    python scripts/eval_columns.py --seed 2 --rows part1.json part2.json   # one table of runs of parts
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import io
import json
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

import ocrserve.engines.onnx as onnx_engine
from ocrserve.bench.columns import KINDS, generate
from ocrserve.config import EngineConfig, OnnxEngineConfig, PreprocessConfig, load_config
from ocrserve.engines.onnx import OnnxEngine
from ocrserve.evaluation import PAGE_BREAK, cer, load_index, locate_corpus, score
from ocrserve.layout import arrange
from ocrserve.pages import Page
from ocrserve.preprocess import DecodeFailure, decode_pages, inspect_document

#: The local profile's preprocess settings (ocrserve/profiles/local.yaml), as the gateway decodes.
PREPROCESS = PreprocessConfig(min_pixels=3136, max_pixels=4_000_000, factor=1, max_side=2000)
#: The timings summed up per kind, as the engine names them in a page's ``timings``.
TIMINGS = ("det_s", "layout_model_s", "rec_s")
#: The two orders ``--compare`` scores: the lines' boxes alone (layout model off), and with regions.
ORDERS = ("boxes", "regions")


class Recorder:
    """Stands in for the engine's ``arrange`` and keeps each call's arguments (``--compare``)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, lines, width, height, rotation=0, regions=()):
        self.calls.append((list(lines), width, height, rotation, regions))
        return arrange(lines, width, height, rotation, regions)


async def read(engine: OnnxEngine, page: Page, recorder: Recorder | None) -> tuple[dict[str, str], dict]:
    """``page``'s text in each order (``regions`` only where not comparing: the engine's own), and
    its timings; a page the gateway reads without OCR (text layer, blank) has the same text in both."""
    if (known := page.known_result()) is not None:
        return dict.fromkeys(ORDERS if recorder else ("engine",), known.text), {}
    if recorder is None:
        result = await engine.ocr_page(page)
        return {"engine": result.text}, result.timings
    recorder.calls.clear()
    result = await engine.ocr_page(page)
    lines, width, height, rotation, _ = recorder.calls[-1]
    return {"boxes": arrange(lines, width, height, rotation).text, "regions": result.text}, result.timings


def generated(seed: int, per_kind: int, kinds: Sequence[str]) -> Iterator[tuple[str, str, str, list[Page]]]:
    """(kind, name, ground truth, [page]) for each generated page of ``kinds``, decoded as the gateway decodes."""
    for page in (generate(kind, seed, number) for kind in kinds for number in range(per_kind)):
        data = io.BytesIO()
        page.image.save(data, format="PNG")
        (decoded,) = decode_pages(data.getvalue(), inspect_document(data.getvalue(), PREPROCESS), [0], PREPROCESS)
        yield page.kind, page.name, page.text, [decoded]


def corpus_documents(corpus: Path, only: Sequence[str] | None) -> Iterator[tuple[object, list[Page]]]:
    """(document, its pages) for each corpus document with whole-page ground truth, decoded by the
    local profile's preprocess settings."""
    cfg = load_config("local", environ={}).preprocess
    for document in load_index(corpus):
        if document.gt_quality.startswith("partial") or document.gt_text_path is None:
            continue
        if only and not any(fnmatch.fnmatch(document.file, glob) for glob in only):
            continue
        data = document.path.read_bytes()
        info = inspect_document(data, cfg)
        pages = decode_pages(data, info, list(range(info.page_count)), cfg)
        yield document, [p for p in pages if not isinstance(p, DecodeFailure)]


async def evaluate(args: argparse.Namespace, onnx: dict, console: Console) -> list[dict]:
    """Every page (or document) read by the engine: one row each (kind, name, CER per order, timings),
    written to ``--json`` as each is read (a run cut short keeps what it read)."""
    recorder = None
    if args.compare:
        onnx = {**onnx, "layout_model": True}
        recorder = onnx_engine.arrange = Recorder()
    engine = OnnxEngine(EngineConfig(onnx=OnnxEngineConfig(**onnx)))
    await engine.start()
    rows = []
    try:
        if args.corpus:
            corpus = args.corpus if isinstance(args.corpus, Path) else locate_corpus()
            if corpus is None:
                raise SystemExit("no corpus: --corpus DIR, or OCRSERVE_CORPUS")
            items = ((d.file.split("/")[0], d.file, d, pages) for d, pages in corpus_documents(corpus, args.only))
        else:
            items = generated(args.seed, args.per_kind, args.kind or KINDS)
        for kind, name, truth, pages in items:
            texts: dict[str, list[str]] = {}
            timings: dict[str, float] = {}
            for page in pages:
                page_texts, page_timings = await read(engine, page, recorder)
                for order, text in page_texts.items():
                    texts.setdefault(order, []).append(text)
                for key in TIMINGS:
                    timings[key] = timings.get(key, 0.0) + page_timings.get(key, 0.0)
            row = {"kind": kind, "name": name, "pages": len(pages), **timings}
            for order, page_texts in texts.items():
                text = PAGE_BREAK.join(page_texts)
                if isinstance(truth, str):
                    row[order] = cer(text, truth)
                else:
                    found = score(truth, text)
                    row[order], row["metric"] = found.primary, found.metric
            shown = {k: f"{v:.3f}" if isinstance(v, float) else v for k, v in row.items() if k not in ("kind", "name")}
            console.print(f"{name}: " + "  ".join(f"{k} {v}" for k, v in shown.items()))
            rows.append(row)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2))
    finally:
        await engine.close()
    return rows


def summary(rows: list[dict], orders: tuple[str, ...], groups: tuple[str, ...]) -> Table:
    """Mean score per order and milliseconds a page, per group (kind or source) and over all rows."""
    table = Table(title="Reading order (CER lower is better, bag-F1 higher; ms a page)")
    for name in ("group", "docs", "pages", *orders, "det ms", "layout model ms", "rec ms"):
        table.add_column(name, justify="right")
    for metric in sorted({r.get("metric", "cer") for r in rows}):
        of_metric = [r for r in rows if r.get("metric", "cer") == metric]
        for group in (*groups, "all"):
            chosen = [r for r in of_metric if group in ("all", r["kind"])]
            if not chosen:
                continue
            pages = sum(r["pages"] for r in chosen) or 1
            cells = [f"{1000 * sum(r.get(key, 0.0) for r in chosen) / pages:.0f}" for key in TIMINGS]
            means = [f"{statistics.fmean(r[order] for r in chosen):.3f}" for order in orders]
            label = group if metric == "cer" else f"{group} ({metric})"
            table.add_row(label, str(len(chosen)), str(pages), *means, *cells)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="1: the development set")
    parser.add_argument("--per-kind", type=int, default=3, help="pages of each layout kind")
    parser.add_argument("--kind", action="append", choices=KINDS, help="only this kind (repeatable; default: all)")
    parser.add_argument(
        "--corpus", nargs="?", const=True, type=Path, metavar="DIR", help="the shared corpus (default: where found)"
    )
    parser.add_argument(
        "--only", action="append", metavar="GLOB", help="with --corpus: only the files matching one (e.g. 'sroie/*')"
    )
    parser.add_argument("--compare", action="store_true", help="score both orders (boxes, regions) from one pass")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an engine.onnx setting")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the per-page rows here")
    parser.add_argument(
        "--rows", type=Path, nargs="+", metavar="JSON", help="summarize rows saved by --json runs (parts of one set)"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    onnx = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    if args.rows:
        rows = [row for path in args.rows for row in json.loads(path.read_text())]
    else:
        rows = asyncio.run(evaluate(args, onnx, console))
    orders = tuple(order for order in (*ORDERS, "engine") if rows and order in rows[0])
    generated_kinds = all(r["kind"] in KINDS for r in rows)
    groups = KINDS if generated_kinds else tuple(dict.fromkeys(r["kind"] for r in rows))
    console.print(summary(rows, orders, groups))
    return 0


if __name__ == "__main__":
    sys.exit(main())
