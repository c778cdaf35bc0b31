#!/usr/bin/env python
"""Throughput: ``ocrserve batch`` pages/min against the gateway at concurrency 4, on the same pages.

The pages are the corpus images (``*/*.png``, ``*.jpg``, ``*.tif`` of ``../shared/corpus`` or
``--corpus``; a multi-page TIFF counts its pages), ``--rounds`` times each. The gateway side starts
a gateway (``ocrserve launch``, local profile), sends each image once to warm it up and count its
pages, then every image ``--rounds`` times with ``--concurrency`` requests in flight. The batch
side then runs what ``ocrserve batch`` runs, on a new local Ray of this machine's cores, over a
folder holding each image ``--rounds`` times (links under ``round-N/``) into an empty ``--out``;
its pages/min is the command's own (the pages execution, OCR actors' start included). The two
sides run one after the other, never at once. The script prints both, their ratio, and exits 1
when the ratio is below ``--target`` (0.9) or a page failed, 2 without the corpus or Ray, or when
the gateway refuses an image at warm-up.

Examples::

    python scripts/bench_batch.py
    python scripts/bench_batch.py --rounds 3 --only 'tesseract/*'
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ocrserve.bench.harness import LocalGateway
from ocrserve.bench.load import count_pages, http_client, load_documents, send
from ocrserve.config import load_config
from ocrserve.evaluation import locate_corpus
from ocrserve.extras import MissingExtra, require

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff"}


@dataclass
class Side:
    """Pages done, pages failed and wall time of one side; for the gateway, the HTTP statuses of
    the requests that failed (0: no answer) and how many of each."""

    name: str
    pages: int
    failures: int
    seconds: float
    statuses: Counter = field(default_factory=Counter)

    @property
    def pages_per_min(self) -> float:
        return 60 * self.pages / self.seconds if self.seconds else 0.0


def corpus_images(corpus: Path, only: str | None) -> dict[Path, Path]:
    """The corpus images (path -> its path relative to the corpus), sorted, narrowed by ``only``."""
    images = sorted(p for p in corpus.glob("*/*") if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    return {p: p.relative_to(corpus) for p in images if fnmatch.fnmatch(str(p.relative_to(corpus)), only or "*")}


async def bench_gateway(images: dict[Path, Path], rounds: int, concurrency: int) -> Side:
    """Pages/min of ``POST /v1/ocr`` with ``concurrency`` requests in flight over every image
    ``rounds`` times, after one warm-up request per image."""
    with LocalGateway() as gateway:
        async with http_client(gateway.url, concurrency) as client:
            documents = await count_pages(client, load_documents(images))
            queue = iter([d for _ in range(rounds) for d in documents])
            pages, failures, statuses = 0, 0, Counter()

            async def worker() -> None:
                nonlocal pages, failures
                for document in queue:  # one shared iterator: each request taken by one worker
                    outcome = await send(client, document)
                    pages += outcome.pages
                    if outcome.status != 200:
                        failures += document.pages
                        statuses[outcome.status] += 1

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            seconds = time.perf_counter() - started
            return Side(f"gateway, concurrency {concurrency}", pages, failures, seconds, statuses)


def bench_batch(images: dict[Path, Path], rounds: int) -> tuple[Side, float]:
    """``ocrserve batch`` over every image ``rounds`` times on a new local Ray; returns its side
    (pages/min of the pages execution) and the wall seconds of the whole run, Ray's start included."""
    from ocrserve.batch.ray_pipeline import ray_cluster, run_batch

    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        documents = {}
        for round_ in range(rounds):
            for image, relative in images.items():
                link = Path(tmp, "in", f"round-{round_}", relative)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(image.resolve())
                documents[link] = str(link.relative_to(Path(tmp, "in"))) + ".json"
        started = time.perf_counter()
        with ray_cluster("local"):
            summary = run_batch(documents, Path(tmp, "out"), load_config("local"))
        wall = time.perf_counter() - started
    failures = summary.failed_pages + sum(e.pages for e in summary.entries if e.status == "failed")
    return Side("ocrserve batch", summary.pages, failures, summary.ocr_seconds), wall


def report(sides: list[Side]) -> Table:
    """Both sides, one row each."""
    table = Table(title="Throughput on the same pages")
    for name in ("reader", "pages", "failed pages", "seconds", "pages/min"):
        table.add_column(name, justify="right")
    for side in sides:
        table.add_row(
            side.name, str(side.pages), str(side.failures), f"{side.seconds:.1f}", f"{side.pages_per_min:.1f}"
        )
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, help="corpus directory (default: $OCRSERVE_CORPUS or ../shared/corpus)")
    parser.add_argument("--only", metavar="GLOB", help="only images whose corpus path matches, e.g. 'tesseract/*'")
    parser.add_argument("--rounds", type=int, default=2, help="times each image is read on each side")
    parser.add_argument("--concurrency", type=int, default=4, help="gateway requests in flight")
    parser.add_argument("--target", type=float, default=0.9, help="least acceptable batch/gateway ratio")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    try:
        require("ray", "scripts/bench_batch.py (ocrserve batch)")
    except MissingExtra as exc:
        console.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
        return 2
    corpus = args.corpus or locate_corpus()
    images = corpus_images(corpus, args.only) if corpus else {}
    if not images:
        console.print("[red]no corpus images[/]: pass --corpus or set OCRSERVE_CORPUS (and check --only)")
        return 2
    try:
        import ray.data  # noqa: F401 (ocrserve batch's engine)
    except ImportError:
        console.print("[red]Ray is not installed[/]: pip install -e '.[ray]'")
        return 2
    console.print(f"{len(images)} images x {args.rounds} rounds; the gateway first, then ocrserve batch")
    try:
        with console.status("gateway"):
            gateway = asyncio.run(bench_gateway(images, args.rounds, args.concurrency))
    except RuntimeError as exc:  # the gateway did not start, or refused an image at warm-up
        console.print(f"[red]gateway[/]: {exc}")
        return 2
    with console.status("ocrserve batch"):
        batch, wall = bench_batch(images, args.rounds)
    console.print(report([gateway, batch]))
    if gateway.statuses:
        failed = ", ".join(f"{count} x {status or 'no answer'}" for status, count in sorted(gateway.statuses.items()))
        console.print(f"gateway requests that failed: {failed}")
    console.print(f"ocrserve batch, whole run with Ray's start: {wall:.1f} s ({60 * batch.pages / wall:.1f} pages/min)")
    ratio = batch.pages_per_min / gateway.pages_per_min if gateway.pages_per_min else 0.0
    passed = ratio >= args.target and gateway.failures == batch.failures == 0
    verdict = "[green]OK[/]" if passed else "[red]FAIL[/]"
    console.print(f"{verdict} batch / gateway = {ratio:.3f} (target >= {args.target})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
