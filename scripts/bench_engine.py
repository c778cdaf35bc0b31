#!/usr/bin/env python
"""Throughput: pages/min through the ocrserve REST API at concurrency 4 against rapidocr called
directly in a loop, on the same fixed set of single-page corpus images.

The page set is every scored single-page image of the corpus (PDFs and multi-page TIFFs left
out), narrowed by ``--only``. Both sides run whole rounds over the set: ``--rounds`` of them, or
as many as start within ``--duration`` seconds. The API side keeps ``--concurrency`` requests in
flight (httpx, asyncio); the direct side calls rapidocr on each file path in this process, one at
a time, after a warm-up call. Both include decoding: the API decodes the uploaded bytes, rapidocr
decodes the file. The script prints both rates and their ratio, and exits 1 when the ratio is
below ``--target`` (0.95) or a request failed, 2 when the corpus or the server cannot be reached.

Examples::

    python scripts/bench_engine.py --url http://127.0.0.1:8000 --rounds 2
    python scripts/bench_engine.py --duration 300 --only 'tesseract/*'
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from eval_corpus import DirectReader, naive_inputs, server_ready  # scripts/ is on sys.path when run as a script
from rich.console import Console
from rich.table import Table

from ocrserve.evaluation import load_index, locate_corpus

REQUEST_TIMEOUT_S = 600.0


@dataclass
class Run:
    """Pages finished, failures and wall time of one side of the benchmark."""

    pages: int
    failures: int
    seconds: float

    @property
    def pages_per_min(self) -> float:
        return 60 * self.pages / self.seconds if self.seconds else 0.0


def single_page_images(corpus: Path, only: str | None) -> list[Path]:
    """The benchmark's fixed page set: scored corpus documents rapidocr reads from their path."""
    documents = [d for d in load_index(corpus) if d.scored and fnmatch.fnmatch(d.file, only or "*")]
    return [d.path for d in documents if d.path.suffix.lower() != ".pdf" and _read_from_path(d.path)]


def _read_from_path(path: Path) -> bool:
    """True when rapidocr gets the file's path as its single page (not a multi-page TIFF)."""
    inputs = naive_inputs(path)
    return len(inputs) == 1 and isinstance(inputs[0], str)


def rounds(pages: list[Path], count: int | None, duration: float | None, start: float) -> Iterator[Path]:
    """The pages, round after round: ``count`` rounds, or rounds begun before ``duration`` s elapse."""
    done = 0
    while (count is not None and done < count) or (duration is not None and time.perf_counter() - start < duration):
        yield from pages
        done += 1


async def bench_api(url: str, pages: list[Path], concurrency: int, count: int | None, duration: float | None) -> Run:
    """Pages/min through ``POST {url}/v1/ocr`` with ``concurrency`` requests in flight."""
    bodies = {page: page.read_bytes() for page in pages}
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def post(page: Path) -> bool:
            response = await client.post(f"{url}/v1/ocr", files={"file": (page.name, bodies[page])})
            return response.status_code == 200

        await post(pages[0])  # warm-up
        start = time.perf_counter()
        queue = rounds(pages, count, duration, start)
        done, failures = 0, 0

        async def worker() -> None:
            nonlocal done, failures
            for page in queue:  # one shared iterator: each page is taken by exactly one worker
                try:
                    ok = await post(page)
                except httpx.HTTPError:
                    ok = False
                done += ok
                failures += not ok

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return Run(done, failures, time.perf_counter() - start)


def bench_direct(pages: list[Path], count: int | None, duration: float | None) -> Run:
    """Pages/min of rapidocr called on each page path in a loop, in this process, after a warm-up."""
    reader = DirectReader()
    reader.read_page(str(pages[0]))  # warm-up
    start = time.perf_counter()
    done = 0
    for page in rounds(pages, count, duration, start):
        reader.read_page(str(page))
        done += 1
    return Run(done, 0, time.perf_counter() - start)


def report(api: Run, direct: Run, concurrency: int) -> Table:
    """Both runs side by side."""
    table = Table(title="Throughput on the same single-page images")
    for name in ("reader", "pages", "failures", "seconds", "pages/min"):
        table.add_column(name, justify="right")
    table.add_row(
        f"API, concurrency {concurrency}",
        str(api.pages),
        str(api.failures),
        f"{api.seconds:.1f}",
        f"{api.pages_per_min:.1f}",
    )
    table.add_row("rapidocr direct", str(direct.pages), "-", f"{direct.seconds:.1f}", f"{direct.pages_per_min:.1f}")
    return table


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="ocrserve base URL")
    parser.add_argument("--corpus", type=Path, help="corpus directory (default: $OCRSERVE_CORPUS or ../shared/corpus)")
    parser.add_argument("--only", metavar="GLOB", help="only pages whose corpus path matches, e.g. 'tesseract/*'")
    parser.add_argument("--concurrency", type=int, default=4, help="API requests in flight")
    runs = parser.add_mutually_exclusive_group()
    runs.add_argument("--rounds", type=int, help="passes over the page set (default 1)")
    runs.add_argument("--duration", type=float, help="start rounds for this many seconds")
    parser.add_argument("--target", type=float, default=0.95, help="least acceptable API/direct ratio")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    corpus = args.corpus or locate_corpus()
    if corpus is None or not (corpus / "index.json").is_file():
        console.print("[red]corpus not found[/]: pass --corpus or set OCRSERVE_CORPUS")
        return 2
    pages = single_page_images(corpus, args.only)
    if not pages:
        console.print("[red]no single-page images match[/]")
        return 2
    url = args.url.rstrip("/")
    if not server_ready(url):
        console.print(f"[red]server not ready[/]: GET {url}/readyz did not answer 200")
        return 2
    count = None if args.duration else (args.rounds or 1)

    console.print(f"{len(pages)} pages a round; API at concurrency {args.concurrency} first, then rapidocr direct")
    with console.status("API"):
        api = asyncio.run(bench_api(url, pages, args.concurrency, count, args.duration))
    with console.status("rapidocr direct"):
        direct = bench_direct(pages, count, args.duration)
    console.print(report(api, direct, args.concurrency))
    ratio = api.pages_per_min / direct.pages_per_min
    passed = ratio >= args.target and api.failures == 0
    verdict = "[green]OK[/]" if passed else "[red]FAIL[/]"
    console.print(f"{verdict} API / direct = {ratio:.3f} (target >= {args.target}); {api.failures} failed requests")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
