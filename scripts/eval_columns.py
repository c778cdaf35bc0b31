#!/usr/bin/env python
"""Reading order on generated multi-column pages (:mod:`ocrserve.bench.columns`): CER per layout kind.

Every page of ``page_set(--seed, --per-kind)`` is encoded as PNG, decoded as the gateway decodes it
(the local profile's preprocess settings) and read by the embedded engine in this process, one page
at a time. The script prints each page's CER and timings, then per kind the mean CER and the mean
milliseconds a page spent in detection (``det_s``, which includes the layout model where it runs),
in the layout model alone (``layout_model_s``) and in recognition. Seed 1 is the development set;
the held-out set is scored with another seed, once, at the end (docs/reading-order.md).

Examples::

    python scripts/eval_columns.py --seed 1                     # development set, engine defaults
    python scripts/eval_columns.py --seed 1 --set layout_model=false --json before.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from ocrserve.bench.columns import KINDS, page_set
from ocrserve.config import EngineConfig, OnnxEngineConfig, PreprocessConfig
from ocrserve.engines.onnx import OnnxEngine
from ocrserve.evaluation import cer
from ocrserve.preprocess import decode_pages, inspect_document

#: The local profile's preprocess settings (ocrserve/profiles/local.yaml), as the gateway decodes.
PREPROCESS = PreprocessConfig(min_pixels=3136, max_pixels=4_000_000, factor=1, max_side=2000)
#: The timings summed up per kind, as the engine names them in a page's ``timings``.
TIMINGS = ("det_s", "layout_model_s", "rec_s")


async def evaluate(seed: int, per_kind: int, onnx: dict, console: Console) -> list[dict]:
    """Every page of the set read by the engine: one row per page (kind, name, CER, timings)."""
    engine = OnnxEngine(EngineConfig(onnx=OnnxEngineConfig(**onnx)))
    await engine.start()
    rows = []
    try:
        for page in page_set(seed, per_kind):
            data = io.BytesIO()
            page.image.save(data, format="PNG")
            (decoded,) = decode_pages(data.getvalue(), inspect_document(data.getvalue(), PREPROCESS), [0], PREPROCESS)
            result = await engine.ocr_page(decoded)
            row = {"kind": page.kind, "name": page.name, "cer": cer(result.text, page.text), **result.timings}
            console.print(
                f"{page.name}: CER {row['cer']:.3f}  " + "  ".join(f"{k} {v}" for k, v in result.timings.items())
            )
            rows.append(row)
    finally:
        await engine.close()
    return rows


def summary(rows: list[dict]) -> Table:
    """Mean CER and milliseconds a page per kind, and over all pages."""
    table = Table(title="Generated multi-column pages (CER lower is better; ms a page)")
    for name in ("kind", "pages", "mean CER", "det ms", "layout model ms", "rec ms"):
        table.add_column(name, justify="right")
    for kind in (*KINDS, "all"):
        chosen = [r for r in rows if kind in ("all", r["kind"])]
        if not chosen:
            continue
        cells = [f"{1000 * statistics.fmean(r.get(key, 0.0) for r in chosen):.0f}" for key in TIMINGS]
        table.add_row(kind, str(len(chosen)), f"{statistics.fmean(r['cer'] for r in chosen):.3f}", *cells)
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1, help="1: the development set")
    parser.add_argument("--per-kind", type=int, default=3, help="pages of each layout kind")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an engine.onnx setting")
    parser.add_argument("--json", type=Path, metavar="OUT", help="write the per-page rows here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 160)
    onnx = {key: yaml.safe_load(value) for key, value in (item.split("=", 1) for item in args.set)}
    rows = asyncio.run(evaluate(args.seed, args.per_kind, onnx, console))
    console.print(summary(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
