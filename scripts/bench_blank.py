#!/usr/bin/env python
"""Blank pages before and after the blank check, and a real scan that must still be read.

Starts two gateways side by side from this checkout (local profile, one decoding process, no
calibration), one with ``preprocess.blank_check=false`` (the code before the check: every page goes
to the engine) and one with it on, and sends each:

- a TIFF of ``--blank`` blank 8 x 8 pages (a few KB), timing the request and counting the pages
  handed to the engine (``ocrserve_engine_pages_total``) and found blank
  (``ocrserve_blank_pages_total``);
- a ``--scan``-page TIFF of real scans from ``../shared/corpus`` (the raster pages tagged
  ``real-scan``, in turn, in grey): every page decoded here, checking that none is taken as blank
  (no engine: seconds), then its first ``--read`` pages sent to the gateway with the check on,
  checking that each is read (bag-of-words F1 against its ground truth).

Prints one line per figure. Exits 1 when a real page came back blank or unread.

Examples::

    python scripts/bench_blank.py                      # 200 blank pages, 200 real pages, 20 read
    python scripts/bench_blank.py --read 200           # read the whole scan (minutes a page on 2 busy cores)
"""

from __future__ import annotations

import argparse
import io
import json
import re
import statistics
import sys
import time
from pathlib import Path

import httpx
from PIL import Image

from ocrserve.bench.harness import LocalGateway
from ocrserve.config import PreprocessConfig
from ocrserve.evaluation import bag_f1, locate_corpus
from ocrserve.preprocess import DecodeFailure, decode_pages, inspect_document
from ocrserve.preprocess.blank import ink_pixels

OVERRIDES = ("preprocess.workers=1", "router.calibrate=false", "router.bulk.timeout_s=3600")


def blank_tiff(pages: int) -> bytes:
    page = Image.new("1", (8, 8), 1)
    buf = io.BytesIO()
    page.save(buf, "TIFF", save_all=True, append_images=[page] * (pages - 1))
    return buf.getvalue()


def scan_tiff(corpus: Path, pages: int) -> tuple[bytes, list[str]]:
    """A TIFF of ``pages`` real scans (corpus raster files tagged real-scan, in turn) and each page's
    ground truth."""
    entries = [
        e
        for e in json.loads((corpus / "index.json").read_text())
        if "real-scan" in e["tags"] and not e["file"].endswith(".pdf") and e.get("gt_quality") != "partial"
    ]
    sources = [(Image.open(corpus / e["file"]).convert("L"), (corpus / e["gt"][0]).read_text()) for e in entries]
    chosen = [sources[i % len(sources)] for i in range(pages)]
    buf = io.BytesIO()
    first, *rest = (image for image, _ in chosen)
    first.save(buf, "TIFF", save_all=True, append_images=rest, compression="tiff_deflate")
    return buf.getvalue(), [text for _, text in chosen]


def metric(client: httpx.Client, name: str) -> float:
    """The sum of a counter's samples in ``/metrics``."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", client.get("/metrics").text, re.M))


def post(client: httpx.Client, name: str, data: bytes) -> tuple[dict, dict]:
    """POST ``data``; returns the result and the figures (seconds, engine and blank pages)."""
    engine, blank = metric(client, "ocrserve_engine_pages_total"), metric(client, "ocrserve_blank_pages_total")
    started = time.perf_counter()
    response = client.post("/v1/ocr", files={"file": (name, data)}, data={"timeout": "3600"})
    seconds = time.perf_counter() - started
    response.raise_for_status()
    figures = {
        "seconds": round(seconds, 2),
        "engine_pages": int(metric(client, "ocrserve_engine_pages_total") - engine),
        "blank_pages": int(metric(client, "ocrserve_blank_pages_total") - blank),
    }
    return response.json(), figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blank", type=int, default=200, help="blank pages in the hostile TIFF")
    parser.add_argument("--scan", type=int, default=200, help="real pages in the scan TIFF (0: skip)")
    parser.add_argument("--read", type=int, default=20, help="pages of the scan sent to the gateway")
    args = parser.parse_args()
    blank = blank_tiff(args.blank)
    print(f"blank TIFF: {args.blank} pages of 8 x 8, {len(blank):,} bytes")
    failed = False
    with (
        LocalGateway(*OVERRIDES, "preprocess.blank_check=false") as off,
        LocalGateway(*OVERRIDES) as on,
        httpx.Client(base_url=off.url, timeout=3700) as c_off,
        httpx.Client(base_url=on.url, timeout=3700) as c_on,
    ):
        _, before = post(c_off, "blank.tif", blank)
        print(f"blank TIFF, blank_check=false (before): {before}")
        result, after = post(c_on, "blank.tif", blank)
        print(f"blank TIFF, blank_check=true (after): {after}, usage {result['usage']}")
        if args.scan:
            corpus = locate_corpus()
            if corpus is None:
                print("corpus not found: real scan skipped")
                return 1
            scan, truths = scan_tiff(corpus, args.scan)
            cfg = PreprocessConfig()
            started = time.perf_counter()
            pages = decode_pages(scan, info := inspect_document(scan, cfg), range(info.page_count), cfg)
            assert not any(isinstance(page, DecodeFailure) for page in pages)
            inks = [ink_pixels(Image.fromarray(page.image)) for page in pages]
            decoded_blank = sum(page.blank for page in pages)
            print(
                f"real scan decoded here: {len(pages)} pages, {len(scan):,} bytes, "
                f"{time.perf_counter() - started:.1f} s, pages blank {decoded_blank}, fewest ink pixels {min(inks):,}"
            )
            scan, truths = scan_tiff(corpus, min(args.read, args.scan))
            result, figures = post(c_on, "scan.tif", scan)
            f1 = [bag_f1(page["text"], truth) for page, truth in zip(result["pages"], truths, strict=True)]
            blanks = sum(page["source"] == "blank" for page in result["pages"])
            unread = sum(not page["text"].strip() for page in result["pages"])
            print(
                f"real scan read, blank_check=true: {len(truths)} pages, {len(scan):,} bytes, {figures}, "
                f"pages blank {blanks}, empty {unread}, bag F1 mean {statistics.mean(f1):.3f} min {min(f1):.3f}"
            )
            failed = decoded_blank > 0 or blanks > 0 or unread > 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
