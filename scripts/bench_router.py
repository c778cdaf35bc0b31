#!/usr/bin/env python3
"""Mixed-load benchmark of the router: a bulk flood plus a steady stream of interactive pages.

Starts its own gateways (local profile, embedded ONNX engine) and prints:

- interactive p50/p95 latency (a) on an idle server, (b) under the bulk flood with lanes,
  (c) under the same flood with ``router.mode: fifo``;
- bulk pages/min with and without the interactive stream, for lanes and FIFO.

Targets (issue 3): (b) p95 <= 1.5 x (a) p95, and bulk pages/min with the stream >= 0.9 x without.

The bulk flood is ``--bulk-pages`` pages sent as 4-page TIFF documents with ``priority=bulk`` by
``--bulk-clients`` concurrent clients; the interactive stream is one single-page request every
``--interval`` seconds. Pages are tesseract's phototest (tests/data, Apache-2.0) unless
``--page`` names another single-page file.

    python scripts/bench_router.py                       # about 8 minutes on 2 cores
    python scripts/bench_router.py --bulk-pages 120 --interval 5 --json out/router.json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from PIL import Image
from rich.console import Console
from rich.table import Table

from ocrserve.bench.harness import REPO, LocalGateway, percentile

DOC_PAGES = 4


@dataclass
class Run:
    """One measurement: interactive latencies and bulk throughput."""

    name: str
    interactive_s: list[float]
    bulk_pages: int = 0
    bulk_seconds: float = 0.0

    @property
    def p50(self) -> float:
        return percentile(self.interactive_s, 50)

    @property
    def p95(self) -> float:
        return percentile(self.interactive_s, 95)

    @property
    def bulk_per_min(self) -> float:
        return 60 * self.bulk_pages / self.bulk_seconds if self.bulk_seconds else float("nan")


def bulk_document(page: Path) -> bytes:
    """A 4-page TIFF of ``page`` (mirrored copies, so no two pages are identical)."""
    image = Image.open(page).convert("RGB")
    copies = [image.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if i % 2 else image for i in range(1, DOC_PAGES)]
    buf = io.BytesIO()
    image.save(buf, "TIFF", save_all=True, append_images=copies)
    return buf.getvalue()


async def post(client: httpx.AsyncClient, data: bytes, **form) -> httpx.Response:
    response = await client.post("/v1/ocr", files={"file": ("doc", data)}, data=form)
    response.raise_for_status()
    return response


async def interactive_stream(
    client: httpx.AsyncClient, page: bytes, interval: float, stop: asyncio.Event, count: int | None = None
) -> list[float]:
    """One single-page request every ``interval`` s until ``stop`` (or ``count`` requests)."""
    latencies: list[float] = []
    while not stop.is_set() and (count is None or len(latencies) < count):
        started = time.perf_counter()
        await post(client, page)
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))
    return latencies


async def bulk_flood(client: httpx.AsyncClient, document: bytes, pages: int, clients: int) -> tuple[int, float]:
    """Send ``pages`` pages as 4-page bulk documents from ``clients`` workers; (pages, seconds)."""
    remaining = [pages // DOC_PAGES]

    async def worker() -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            await post(client, document, priority="bulk")

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return (pages // DOC_PAGES) * DOC_PAGES, time.perf_counter() - started


async def measure(url: str, name: str, page: bytes, document: bytes, args, *, flood: bool, stream: bool) -> Run:
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        await post(client, page)  # warm the path
        stop = asyncio.Event()
        if not flood:
            return Run(name, await interactive_stream(client, page, args.interval, stop, args.idle_requests))
        streamer = asyncio.create_task(interactive_stream(client, page, args.interval, stop)) if stream else None
        await asyncio.sleep(0.5 if stream else 0)  # the flood starts just after the stream
        pages, seconds = await bulk_flood(client, document, args.bulk_pages, args.bulk_clients)
        stop.set()
        latencies = await streamer if streamer else []
        return Run(name, latencies, pages, seconds)


def run_mode(mode: str, page: bytes, document: bytes, args, console: Console) -> list[Run]:
    runs = []
    with LocalGateway(f"router.mode={mode}", *args.set) as gateway:
        plan = [("idle", False, True)] if mode == "lanes" else []
        plan += [("bulk only", True, False), ("bulk + interactive", True, True)]
        for label, flood, stream in plan:
            console.print(f"[bold]{mode}[/bold]: {label} ...")
            runs.append(
                asyncio.run(measure(gateway.url, f"{mode}: {label}", page, document, args, flood=flood, stream=stream))
            )
    return runs


def report(runs: list[Run], console: Console) -> dict:
    table = Table("run", "interactive n", "p50 s", "p95 s", "bulk pages", "bulk pages/min")
    for run in runs:
        table.add_row(
            run.name,
            str(len(run.interactive_s)),
            f"{run.p50:.2f}",
            f"{run.p95:.2f}",
            str(run.bulk_pages or ""),
            f"{run.bulk_per_min:.1f}" if run.bulk_pages else "",
        )
    console.print(table)
    by = {run.name: run for run in runs}
    idle, lanes, fifo = by["lanes: idle"], by["lanes: bulk + interactive"], by["fifo: bulk + interactive"]
    figures = {
        "p95_ratio_lanes": lanes.p95 / idle.p95,
        "p95_ratio_fifo": fifo.p95 / idle.p95,
        "bulk_ratio_lanes": lanes.bulk_per_min / by["lanes: bulk only"].bulk_per_min,
        "bulk_ratio_fifo": fifo.bulk_per_min / by["fifo: bulk only"].bulk_per_min,
    }
    console.print(
        f"(b)/(a) interactive p95: lanes {figures['p95_ratio_lanes']:.2f}x (target <= 1.5), "
        f"fifo {figures['p95_ratio_fifo']:.2f}x\n"
        f"bulk throughput with/without the stream: lanes {figures['bulk_ratio_lanes']:.2f} (target >= 0.9), "
        f"fifo {figures['bulk_ratio_fifo']:.2f}"
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--page", type=Path, default=REPO / "tests" / "data" / "phototest.tif")
    parser.add_argument("--bulk-pages", type=int, default=160, help="pages in the flood (>= 100)")
    parser.add_argument("--bulk-clients", type=int, default=4)
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between interactive requests")
    parser.add_argument("--idle-requests", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], help="extra gateway overrides, key=value")
    parser.add_argument("--json", type=Path, help="write runs and ratios here")
    args = parser.parse_args()
    console = Console()
    page = args.page.read_bytes()
    document = bulk_document(args.page)
    runs = run_mode("lanes", page, document, args, console) + run_mode("fifo", page, document, args, console)
    figures = report(runs, console)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "runs": [asdict(r) | {"p50": r.p50, "p95": r.p95, "bulk_per_min": r.bulk_per_min} for r in runs],
            "figures": figures,
            "args": {k: str(v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
