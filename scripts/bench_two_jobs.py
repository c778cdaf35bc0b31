#!/usr/bin/env python
"""Two jobs of different priority at once on the embedded engine: bulk pages per minute, each job's
time, and how many recognition crops the engine groups into one batch.

For each checkout given (default: this one) it launches a gateway (``local`` profile, jobs in a
temporary folder), waits for ``/readyz``, submits two jobs of ``--pages`` pages at once (priorities
``--priorities``, public scale: higher runs first), polls both to their end and reads the gateway's
``ocrserve_engine_batch_size`` histogram. Pages are the repository's ``examples/phototest.tif``,
each with a page number written into a corner so that no two are alike. With several checkouts
(``--checkout before --checkout .``) the runs alternate ``--rounds`` times, so both see the same
machine.

    python scripts/bench_two_jobs.py --pages 24
    python scripts/bench_two_jobs.py --checkout /tmp/before --checkout . --rounds 2
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from PIL import Image, ImageDraw
from prometheus_client.parser import text_string_to_metric_families

from ocrserve.bench.harness import REPO, LocalGateway

#: Seconds between polls of a job's status.
POLL_S = 0.5


def numbered_pages(pages: int) -> bytes:
    """A multi-page TIFF: ``examples/phototest.tif`` ``pages`` times, page ``i`` marked ``#i``."""
    base = Image.open(REPO / "examples" / "phototest.tif").convert("RGB")
    images = []
    for number in range(pages):
        image = base.copy()
        ImageDraw.Draw(image).text((8, base.height - 16), f"#{number}", fill=(0, 0, 0))
        images.append(image)
    out = io.BytesIO()
    images[0].save(out, "TIFF", save_all=True, append_images=images[1:])
    return out.getvalue()


def batch_size(exposition: str) -> tuple[float, float]:
    """``ocrserve_engine_batch_size``'s (sum, count): crops and recognition groups so far."""
    values = {"sum": 0.0, "count": 0.0}
    for family in text_string_to_metric_families(exposition):
        if family.name == "ocrserve_engine_batch_size":
            for sample in family.samples:
                for key in values:
                    if sample.name.endswith("_" + key):
                        values[key] = sample.value
    return values["sum"], values["count"]


def run_once(checkout: Path, document: bytes, pages: int, priorities: list[int]) -> dict:
    """Both jobs through a fresh gateway of ``checkout``; their figures."""
    with tempfile.TemporaryDirectory() as store:
        gateway = LocalGateway(f"store.data_dir={store}", "store.cache_entries=0", repo=checkout)
        with gateway, httpx.Client(base_url=gateway.url, timeout=60) as http:
            crops0, groups0 = batch_size(http.get("/metrics").text)
            started = time.monotonic()
            jobs = {}
            for priority in priorities:
                files = {"file": ("pages.tif", document)}
                answer = http.post("/v1/jobs", files=files, data={"priority": str(priority)})
                answer.raise_for_status()
                jobs[priority] = answer.json()["id"]
            finished: dict[int, float] = {}
            while len(finished) < len(jobs):
                for priority, job in jobs.items():
                    if priority not in finished and http.get(f"/v1/jobs/{job}").json()["status"] not in (
                        "queued",
                        "running",
                    ):
                        finished[priority] = time.monotonic() - started
                time.sleep(POLL_S)
            crops, groups = batch_size(http.get("/metrics").text)
    wall = max(finished.values())
    return {
        "pages_per_min": len(jobs) * pages / wall * 60,
        "seconds": {p: round(s, 1) for p, s in finished.items()},
        "crops_per_group": (crops - crops0) / max(1.0, groups - groups0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", action="append", type=Path, help="repository to launch (repeatable)")
    parser.add_argument("--pages", type=int, default=24, help="pages per job")
    parser.add_argument("--priorities", default="9,0", help="the two jobs' priorities (higher runs first)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per checkout, alternating")
    args = parser.parse_args()
    checkouts = [c.resolve() for c in args.checkout or [REPO]]
    priorities = [int(p) for p in args.priorities.split(",")]
    document = numbered_pages(args.pages)
    results: dict[Path, list[dict]] = {c: [] for c in checkouts}
    for round_ in range(args.rounds):
        for checkout in checkouts:
            result = run_once(checkout, document, args.pages, priorities)
            results[checkout].append(result)
            print(f"round {round_ + 1} {checkout}: {result}", flush=True)
    for checkout, runs in results.items():
        rates = [r["pages_per_min"] for r in runs]
        crops = [r["crops_per_group"] for r in runs]
        print(
            f"{checkout}: {statistics.median(rates):.1f} pages/min (runs: {', '.join(f'{r:.1f}' for r in rates)}); "
            f"{statistics.median(crops):.1f} crops per recognition group"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
