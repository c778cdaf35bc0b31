"""Many ordinary clients against one gateway: do accepted requests finish, and does a small one
get through? (issue 13's two many-clients cases)

``documents``: ``--clients`` clients each post a ``--pages``-page PDF at the same instant with a
``--timeout``. Reported: how many were accepted, how many of those completed within it (and when),
how many were refused at once (503 with ``Retry-After``) and how fast, how many were accepted and
then failed with 504, and the pages completed in the window against what the engine does alone in
as long (measured first, one document after another).

``mixed``: ``--clients`` clients post ``--pages``-page PDFs in a loop (a refused one waits its
``Retry-After``, as a well-behaved client does) while one more client posts a single small page
every ``--interval`` seconds; reported: the small page's median and p95 against its idle p95
(measured first), and accepted-then-504 as a share of accepted requests.

Each client names itself with ``X-Client-Id`` (the gateway is started with ``router.fair_by:
header``: on one machine they all share an address). Prints the figures; no targets are asserted.

Usage::

    python scripts/many_clients.py documents --clients 30 --pages 10 --timeout 300
    python scripts/many_clients.py mixed --clients 12 --pages 4 --seconds 120
"""

from __future__ import annotations

import argparse
import io
import statistics
import threading
import time
from pathlib import Path

import httpx
from PIL import Image

from ocrserve.bench.harness import LocalGateway

SAMPLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "phototest.tif"


def pdf(pages: int) -> bytes:
    """``pages`` copies of phototest as one PDF."""
    page = Image.open(SAMPLE).convert("RGB")
    out = io.BytesIO()
    page.save(out, "PDF", save_all=True, append_images=[page] * (pages - 1), resolution=100)
    return out.getvalue()


def post(url: str, data: bytes, name: str, client: str, timeout: float | None = None) -> tuple[int, float, dict]:
    """POST one document; ``(status, seconds, headers)``."""
    form = {"timeout": str(timeout)} if timeout else {}
    started = time.monotonic()
    response = httpx.post(
        url + "/v1/ocr", files={"file": (name, data)}, data=form, headers={"X-Client-Id": client}, timeout=None
    )
    return response.status_code, time.monotonic() - started, dict(response.headers)


def alone_rate(url: str, document: bytes, pages: int, seconds: float) -> float:
    """Pages per second one client gets posting the document again and again for ``seconds``."""
    done, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        status, _, _ = post(url, document, "alone.pdf", "alone")
        done += pages if status == 200 else 0
    return done / (time.monotonic() - started)


def documents(url: str, clients: int, pages: int, timeout: float) -> None:
    document = pdf(pages)
    rate = alone_rate(url, document, pages, min(timeout, 30))
    results: list[tuple[int, float, dict]] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(post(url, document, f"d{i}.pdf", f"c{i}", timeout)))
        for i in range(clients)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    window = time.monotonic() - started
    done = sorted(s for status, s, _ in results if status == 200)
    refused = [(s, h.get("retry-after")) for status, s, h in results if status == 503]
    late = sum(status == 504 for status, _, _ in results)
    print(f"{clients} clients x {pages}-page PDF, timeout {timeout:g} s; the engine alone: {rate:.2f} pages/s")
    print(f"  accepted {len(done) + late}: completed {len(done)}, accepted then 504: {late}")
    print("  completed at (s): " + ", ".join(f"{s:.1f}" for s in done))
    if refused:
        slowest = max(s for s, _ in refused)
        print(
            f"  refused at once (503): {len(refused)}, within {slowest:.2f} s, all with Retry-After: "
            f"{all(r for _, r in refused)}"
        )
    pages_done = len(done) * pages
    print(
        f"  pages completed in the {window:.0f} s window: {pages_done}, the engine alone would do "
        f"{rate * window:.0f} ({pages_done / max(rate * window, 1e-9):.0%})"
    )


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) > 1 else values[0]


def mixed(url: str, clients: int, pages: int, seconds: float, interval: float) -> None:
    small = SAMPLE.read_bytes()
    post(url, small, "s.tif", "small")  # warm-up: the first request after start pays one-time costs
    idle = [post(url, small, "s.tif", "small")[1] for _ in range(20)]
    document, stop = pdf(pages), threading.Event()
    outcomes: list[int] = []

    def flood(client: str) -> None:
        while not stop.is_set():
            status, _, headers = post(url, document, "f.pdf", client)
            outcomes.append(status)
            if status in (429, 503):  # a well-behaved client waits as long as the gateway asks
                stop.wait(float(headers.get("retry-after", 1)))

    threads = [threading.Thread(target=flood, args=(f"c{i}",)) for i in range(clients)]
    for thread in threads:
        thread.start()
    loaded, started = [], time.monotonic()
    refused = 0
    while time.monotonic() - started < seconds:
        status, s, _ = post(url, small, "s.tif", "small")
        if status == 200:
            loaded.append(s)
        else:
            refused += 1
        time.sleep(max(0.0, interval - s))
    stop.set()
    for thread in threads:
        thread.join()
    accepted = [o for o in outcomes if o != 503]
    late = sum(o == 504 for o in accepted)
    print(f"{clients} clients x {pages}-page PDFs in a loop for {seconds:g} s, a single page every {interval:g} s")
    print(
        f"  small page idle p95 {p95(idle):.2f} s; under load median {statistics.median(loaded):.2f} s, "
        f"p95 {p95(loaded):.2f} s ({p95(loaded) / p95(idle):.2f}x idle), {len(loaded)} pages, "
        f"{refused} not answered 200"
    )
    print(
        f"  flood requests: {len(outcomes)}, refused at once {len(outcomes) - len(accepted)}, accepted "
        f"{len(accepted)}, of which 504: {late} ({late / max(len(accepted), 1):.1%})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=["documents", "mixed"])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=300.0, help="documents: each request's timeout, s")
    parser.add_argument("--seconds", type=float, default=120.0, help="mixed: how long the flood lasts, s")
    parser.add_argument("--interval", type=float, default=1.0, help="mixed: seconds between small pages")
    parser.add_argument("--url", help="a running gateway (started with router.fair_by: header) instead of one here")
    args = parser.parse_args()
    gateway = None if args.url else LocalGateway("router.fair_by=header", profile="local").wait_ready()
    url = args.url or gateway.url
    try:
        if args.scenario == "documents":
            documents(url, args.clients, args.pages, args.timeout)
        else:
            mixed(url, args.clients, args.pages, args.seconds, args.interval)
    finally:
        if gateway:
            gateway.stop()


if __name__ == "__main__":
    main()
