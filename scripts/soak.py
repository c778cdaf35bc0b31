#!/usr/bin/env python3
"""Soak test: a real gateway on loopback under mixed load above its capacity for a while.

Starts its own gateway (local profile, dedup cache off, jobs in a temporary folder), then:

1. **warm-up and capacity**: ``--warmup-concurrency`` clients send single-page fast-lane requests
   back to back for ``--warmup`` seconds; pages answered per second over its last two thirds is
   the capacity. One job then warms the bulk lane up, and the memory baseline is taken.
2. **load** for ``--duration`` seconds, open loop (Poisson arrivals) at ``--rate`` pages/s, by
   default ``--capacity-multiple`` (2) times the capacity: ``1 - --bulk-share`` of the pages as
   synchronous single-page ``POST /v1/ocr`` requests (``--page``: each post, as in the warm-up,
   a copy with bytes of its own, ``page_mixes.copies``, as a client's pages are new to the
   gateway), the rest as jobs of ``--files-per-job`` copies of ``--document`` (``POST /v1/jobs``,
   polled to their end). At most ``--max-requests`` requests and ``--max-jobs`` jobs are
   outstanding; arrivals beyond are counted as held back, not sent, so the client's own backlog
   stays bounded.
3. **drain**: outstanding requests and jobs get ``--drain`` seconds more to finish.

It reports per lane: sent, accepted, completed, rejected (by status, with or without
``Retry-After``), failures of accepted requests (any answer but 200 to an admitted request, a job
not ``succeeded``, or one still running after the drain: must be 0), latency p50/p95 (request to
answer; job submission to its end as polled), and the RSS of the gateway process and of its decoding
processes after the warm-up, at their peak and at the end, with the growth, and its trend under
load (the median of the load's last quarter of samples over its first: a leak grows steadily, the
working set of the work in flight does not). Tracebacks in the gateway's log are counted. Exit
status 1 when an accepted request failed.

    python scripts/soak.py --duration 600 --out out/soak.json     # the 10-minute soak
    python scripts/soak.py --duration 120 --capacity-multiple 3
    python scripts/soak.py --rate 4 --set router.overload_status=429
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from ocrserve.bench.harness import REPO, LocalGateway, percentile
from ocrserve.bench.page_mixes import copies
from ocrserve.config import load_config
from ocrserve.preprocess import inspect_document

#: Seconds between RSS samples of the gateway and its decoding processes.
MEMORY_SAMPLE_S = 5.0
#: Seconds between polls of an outstanding job's status.
JOB_POLL_S = 1.0
#: Seconds a client waits for one answer (the fast lane's own deadline is 60 s).
CLIENT_TIMEOUT_S = 120.0
#: Statuses that refuse work for overload or quota: rejections, not failures.
REJECTIONS = {429, 503}
#: Job states after which a job changes no more.
JOB_TERMINAL = {"succeeded", "failed", "partial", "cancelled"}
MIB = 1 << 20
#: How a 503 ``latency-target`` names the target it applied (``Router._check_latency_target``).
LATENCY_TARGET = re.compile(r"above its latency target of ([0-9.]+) s")


@dataclass
class Lane:
    """What happened to one lane's requests (fast: synchronous requests; bulk: jobs)."""

    name: str
    sent: int = 0
    held_back: int = 0
    accepted: int = 0
    completed: int = 0
    pages: int = 0
    rejected: Counter = field(default_factory=Counter)
    failures: Counter = field(default_factory=Counter)
    latencies_s: list[float] = field(default_factory=list)
    targets_s: list[float] = field(default_factory=list)  # latency targets named by its refusals

    def reject(self, response: httpx.Response) -> None:
        """Count a refusal by its status and whether it said when to retry, and keep the latency
        target it names (a 503 ``latency-target``: the target for this very request)."""
        retry = "with Retry-After" if "retry-after" in response.headers else "WITHOUT Retry-After"
        self.rejected[f"{response.status_code} {retry}"] += 1
        if target := LATENCY_TARGET.search(problem_text(response)):
            self.targets_s.append(float(target.group(1)))

    def fail(self, reason: str) -> None:
        """Count a failure of accepted work (or of the transport) by its reason."""
        self.failures[reason[:160]] += 1

    def figures(self) -> dict:
        """The lane's totals and latency percentiles, for the report and the JSON."""
        return {
            "sent": self.sent,
            "held_back": self.held_back,
            "accepted": self.accepted,
            "completed": self.completed,
            "pages_completed": self.pages,
            "rejected": dict(self.rejected),
            "failures": dict(self.failures),
            "latency_p50_s": percentile(self.latencies_s, 50),
            "latency_p95_s": percentile(self.latencies_s, 95),
            "latency_targets_s": sorted(set(self.targets_s)),
        }


def problem_text(response: httpx.Response) -> str:
    """``<status> <problem detail or body start>``, to name a failure."""
    try:
        detail = response.json().get("detail", "")
    except ValueError:
        detail = response.text[:120]
    return f"{response.status_code} {detail}"


async def admitted(lane: Lane, send: Awaitable[httpx.Response], expected: int) -> httpx.Response | None:
    """``send``'s response when the gateway accepted it with ``expected``; otherwise None, having
    counted it as sent and then rejected (a 503/429) or failed (a transport error or another status)."""
    lane.sent += 1
    try:
        response = await send
    except httpx.HTTPError as exc:
        lane.fail(f"transport: {type(exc).__name__}")
        return None
    if response.status_code in REJECTIONS:
        lane.reject(response)
        return None
    lane.accepted += 1
    if response.status_code != expected:
        lane.fail(problem_text(response))
        return None
    return response


async def fast_request(client: httpx.AsyncClient, page: bytes, lane: Lane) -> None:
    """One synchronous single-page request in the fast lane."""
    started = time.monotonic()
    send = client.post("/v1/ocr", files={"file": ("page", page)}, data={"priority": "interactive"})
    if await admitted(lane, send, 200) is None:
        return
    lane.completed += 1
    lane.pages += 1
    lane.latencies_s.append(time.monotonic() - started)


async def bulk_job(client: httpx.AsyncClient, files: list, pages: int, lane: Lane, give_up_at: float) -> None:
    """One job: submitted, then polled until it ends or ``give_up_at`` (``time.monotonic()``) passes."""
    started = time.monotonic()
    response = await admitted(lane, client.post("/v1/jobs", files=files), 202)
    if response is None:
        return
    status = await poll_job(client, response.headers["location"], give_up_at)
    if status != "succeeded":
        lane.fail(f"job {status}")
        return
    lane.completed += 1
    lane.pages += pages
    lane.latencies_s.append(time.monotonic() - started)


async def poll_job(client: httpx.AsyncClient, location: str, give_up_at: float) -> str:
    """The job's final status, ``"unfinished after the drain"``, or ``"unreadable: ..."``."""
    while time.monotonic() < give_up_at:
        await asyncio.sleep(JOB_POLL_S)
        try:
            response = await client.get(location)
        except httpx.HTTPError as exc:
            return f"unreadable: {type(exc).__name__}"
        if response.status_code != 200:
            return f"unreadable: {problem_text(response)}"
        if (status := response.json()["status"]) in JOB_TERMINAL:
            return status
    return "unfinished after the drain"


async def arrivals(rate: float, until: float, rng: random.Random, start: Callable[[], None]) -> None:
    """Call ``start()`` at Poisson arrivals of ``rate`` per second until ``until`` (monotonic)."""
    if rate <= 0:
        return
    at = time.monotonic()
    while (at := at + rng.expovariate(rate)) < until:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        start()


class Outstanding:
    """Tasks in flight, at most ``limit``; a start beyond it is counted as held back.

    Args:
        limit: most tasks at once.
        lane: counts the held-back arrivals.
    """

    def __init__(self, limit: int, lane: Lane):
        self.limit, self.lane = limit, lane
        self.tasks: set[asyncio.Task] = set()

    def start(self, work: Callable[[], Awaitable[None]]) -> None:
        """Start ``work()`` now, or count it held back when ``limit`` tasks run."""
        if len(self.tasks) >= self.limit:
            self.lane.held_back += 1
            return
        task = asyncio.ensure_future(work())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def wait(self) -> None:
        """Until every task started has ended."""
        while self.tasks:
            await asyncio.gather(*list(self.tasks))


@dataclass
class Memory:
    """RSS samples of the gateway and its decoding processes, MiB."""

    pid: int
    phase: str = "warm-up"
    samples: list[dict] = field(default_factory=list)

    def sample(self, label: str = "") -> dict:
        """Take one sample: the gateway process's RSS and the sum over its decoding processes
        (``multiprocessing`` spawn workers among its children)."""
        gateway = psutil.Process(self.pid)
        workers = []
        for child in gateway.children(recursive=True):
            try:
                if any("spawn_main" in part for part in child.cmdline()):
                    workers.append(child.memory_info().rss)
            except psutil.Error:  # a worker recycled meanwhile
                continue
        sample = {
            "t": time.time(),
            "label": label,
            "phase": self.phase,
            "gateway_mib": gateway.memory_info().rss / MIB,
            "workers_mib": sum(workers) / MIB,
            "workers": len(workers),
        }
        self.samples.append(sample)
        return sample

    async def watch(self, stop: asyncio.Event) -> None:
        """Sample every :data:`MEMORY_SAMPLE_S` until ``stop``."""
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), MEMORY_SAMPLE_S)

    def figures(self) -> dict:
        """Start (the first labelled ``start``), peak and end (the last sample) of each, growth in %."""
        start = next(s for s in self.samples if s["label"] == "start")
        end = self.samples[-1]
        out = {}
        for key in ("gateway_mib", "workers_mib"):
            out[key] = {
                "start": start[key],
                "peak": max(s[key] for s in self.samples if s["t"] >= start["t"]),
                "end": end[key],
                "growth_pct": 100 * (end[key] - start[key]) / start[key] if start[key] else float("nan"),
            }
            out[key]["load_trend_pct"] = self._load_trend(key)
        out["workers"] = {"start": start["workers"], "end": end["workers"]}
        return out

    def _load_trend(self, key: str) -> float:
        """Growth in % from the median of the load's first quarter of samples to that of its last:
        a leak grows steadily, while the working set of work in flight does not."""
        load = [s[key] for s in self.samples if s["phase"] == "load"]
        if len(load) < 4:
            return float("nan")
        quarter = len(load) // 4
        first, last = statistics.median(load[:quarter]), statistics.median(load[-quarter:])
        return 100 * (last - first) / first


async def measure_capacity(
    client: httpx.AsyncClient, pages: Iterator[bytes], seconds: float, concurrency: int
) -> float:
    """Fast-lane pages (the next of ``pages`` each post) answered per second by ``concurrency``
    clients back to back for ``seconds``, counted over the last two thirds (the first third warms
    the engine up).

    Raises:
        RuntimeError: no page was answered in the counted part.
    """
    started = time.monotonic()
    counted_from, until = started + seconds / 3, started + seconds
    done = 0

    async def closed_loop() -> None:
        nonlocal done
        while time.monotonic() < until:
            page = {"file": ("page", next(pages))}
            response = await client.post("/v1/ocr", files=page, data={"priority": "interactive"})
            done += response.status_code == 200 and time.monotonic() > counted_from

    await asyncio.gather(*(closed_loop() for _ in range(concurrency)))
    if not done:
        raise RuntimeError("no page was answered during the warm-up")
    return done / (time.monotonic() - counted_from)


async def engine_pages(client: httpx.AsyncClient) -> dict[str, float]:
    """``ocrserve_engine_pages_total`` per lane: pages the router has handed the engine so far."""
    exposition = (await client.get("/metrics")).text
    return {
        lane: sum(
            sample.value
            for family in text_string_to_metric_families(exposition)
            for sample in family.samples
            if sample.name == "ocrserve_engine_pages_total" and sample.labels.get("lane") == lane
        )
        for lane in ("fast", "bulk")
    }


async def soak(url: str, pid: int, args: argparse.Namespace, console: Console) -> dict:
    """Warm up, measure capacity, run the load, drain; the figures."""
    pages = copies(args.page.read_bytes())  # each post a page of its own, as a client's pages are
    document = args.document.read_bytes()
    pages_per_job = args.files_per_job * inspect_document(document, load_config().preprocess).page_count
    files = [("file", (f"{args.document.name}.{n}", document)) for n in range(args.files_per_job)]
    limits = httpx.Limits(max_connections=args.max_requests + args.max_jobs + 8)
    memory = Memory(pid)
    async with httpx.AsyncClient(base_url=url, timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        console.print(f"warm-up: {args.warmup:g} s at concurrency {args.warmup_concurrency} ...")
        capacity = await measure_capacity(client, pages, args.warmup, args.warmup_concurrency)
        rate = args.rate or args.capacity_multiple * capacity
        fast_rate, job_rate = rate * (1 - args.bulk_share), rate * args.bulk_share / pages_per_job
        console.print(
            f"capacity {capacity:.2f} pages/s; offering {rate:.2f} pages/s for {args.duration:g} s: "
            f"{fast_rate:.2f} requests/s (1 page) + {job_rate:.3f} jobs/s ({pages_per_job} pages)"
        )
        # bulk pages run on the engine's own single-threaded sessions, created on the first one
        await bulk_job(client, files, pages_per_job, Lane("warm-up"), time.monotonic() + CLIENT_TIMEOUT_S)
        memory.sample("start")
        memory.phase = "load"
        stop_memory = asyncio.Event()
        watcher = asyncio.create_task(memory.watch(stop_memory))
        fast, bulk = Lane("fast"), Lane("bulk")
        requests, jobs = Outstanding(args.max_requests, fast), Outstanding(args.max_jobs, bulk)
        rng = random.Random(args.seed)
        engine_before = await engine_pages(client)
        load_end = time.monotonic() + args.duration
        give_up_at = load_end + args.drain
        await asyncio.gather(
            arrivals(fast_rate, load_end, rng, lambda: requests.start(lambda: fast_request(client, next(pages), fast))),
            arrivals(
                job_rate,
                load_end,
                rng,
                lambda: jobs.start(lambda: bulk_job(client, files, pages_per_job, bulk, give_up_at)),
            ),
        )
        engine_after = await engine_pages(client)
        stats = (await client.get("/v1/stats")).json()
        console.print(f"load done; draining (at most {args.drain:g} s) ...")
        memory.phase = "drain"
        drain_started = time.monotonic()
        await asyncio.gather(requests.wait(), jobs.wait())
        drain_s = time.monotonic() - drain_started
        stop_memory.set()
        await watcher
        memory.sample("end")
    return {
        "capacity_pages_per_s": capacity,
        "offered_pages_per_s": rate,
        "duration_s": args.duration,
        "drain_s": drain_s,
        "lanes": {lane.name: lane.figures() for lane in (fast, bulk)},
        "engine_pages_during_load": {lane: engine_after[lane] - engine_before[lane] for lane in engine_after},
        "fast_latency_target_s": stats["fast_latency_target_s"],
        "upper_factor_at_load_end": stats["upper_factor"],
        "memory": memory.figures(),
        "memory_samples": memory.samples,
    }


def log_findings(path: Path) -> dict:
    """Tracebacks and ERROR lines in the gateway's log (``path``)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    return {
        "path": str(path),
        "tracebacks": text.count("Traceback (most recent call last)"),
        "error_lines": sum("ERROR" in line for line in text.splitlines()),
    }


def report(figures: dict, console: Console) -> None:
    """Tables of the lanes and of memory."""
    lanes = Table(
        title=f"soak: {figures['duration_s']:g} s at {figures['offered_pages_per_s']:.2f} pages/s "
        f"(capacity {figures['capacity_pages_per_s']:.2f})"
    )
    for column in ("lane", "sent", "held back", "accepted", "completed", "rejected", "failures", "p50 s", "p95 s"):
        lanes.add_column(column)
    for name, lane in figures["lanes"].items():
        lanes.add_row(
            name,
            str(lane["sent"]),
            str(lane["held_back"]),
            str(lane["accepted"]),
            str(lane["completed"]),
            "\n".join(f"{k}: {v}" for k, v in lane["rejected"].items()) or "0",
            "\n".join(f"{k}: {v}" for k, v in lane["failures"].items()) or "0",
            f"{lane['latency_p50_s']:.2f}",
            f"{lane['latency_p95_s']:.2f}",
        )
    console.print(lanes)
    engine = figures["engine_pages_during_load"]
    total = sum(engine.values()) or 1
    console.print(
        "pages the engine took during the load: "
        + ", ".join(f"{lane} {pages:.0f} ({pages / total:.0%})" for lane, pages in engine.items())
    )
    target = figures["fast_latency_target_s"]
    console.print(
        "the fast lane's latency target at the load's end (GET /v1/stats, a page of the average work): "
        + (f"{target:.2f} s" if target is not None else "none")
        + f"; admission's upper factor {figures['upper_factor_at_load_end']:.2f}"
    )
    if targets := figures["lanes"]["fast"]["latency_targets_s"]:
        console.print(
            "the latency target its refusals named for the fast page: "
            + ", ".join(f"{t:g} s" for t in targets)
            + f"; its p95 {figures['lanes']['fast']['latency_p95_s']:.2f} s"
        )
    memory = Table(title="RSS, MiB (start: after the warm-up; trend: the load's last quarter over its first)")
    for column in ("process", "start", "peak", "end", "growth", "trend under load"):
        memory.add_column(column)
    workers = figures["memory"]["workers"]
    for key, label in (
        ("gateway_mib", "gateway"),
        ("workers_mib", f"decoding ({workers['start']} -> {workers['end']})"),
    ):
        row = figures["memory"][key]
        memory.add_row(
            label,
            f"{row['start']:.0f}",
            f"{row['peak']:.0f}",
            f"{row['end']:.0f}",
            f"{row['growth_pct']:+.1f}%",
            f"{row['load_trend_pct']:+.1f}%",
        )
    console.print(memory)
    log = figures["gateway_log"]
    console.print(f"gateway log: {log['tracebacks']} tracebacks, {log['error_lines']} ERROR lines ({log['path']})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    data = REPO / "tests" / "data"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    parser.add_argument("--rate", type=float, help="offered pages/s (default: --capacity-multiple x capacity)")
    parser.add_argument("--capacity-multiple", type=float, default=2.0)
    parser.add_argument("--bulk-share", type=float, default=0.25, help="fraction of the pages sent as jobs")
    parser.add_argument("--page", type=Path, default=data / "phototest.tif", help="the fast lane's one-page image")
    parser.add_argument("--document", type=Path, default=data / "testTIFF_multipage.tif", help="a job's document")
    parser.add_argument("--files-per-job", type=int, default=2)
    parser.add_argument("--max-requests", type=int, default=64, help="most synchronous requests outstanding")
    parser.add_argument("--max-jobs", type=int, default=8, help="most jobs outstanding")
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds of warm-up that measure the capacity")
    parser.add_argument("--warmup-concurrency", type=int, default=4)
    parser.add_argument("--drain", type=float, default=180.0, help="seconds outstanding work may take after the load")
    parser.add_argument("--workers", type=int, default=0, help="decoding processes (0: one per core)")
    parser.add_argument("--seed", type=int, default=0, help="of the arrival times")
    parser.add_argument("--set", action="append", default=[], help="extra gateway overrides, key=value")
    parser.add_argument("--out", type=Path, help="write the figures and memory samples here (JSON)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    with tempfile.TemporaryDirectory(prefix="ocrserve-soak-") as data_dir:
        overrides = [f"preprocess.workers={args.workers}", f"store.data_dir={data_dir}", "store.cache_entries=0"]
        log_path = args.out.with_suffix(".gateway.log") if args.out else Path(data_dir) / "gateway.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("wb") as log, LocalGateway(*overrides, *args.set, log=log) as gateway:
            figures = asyncio.run(soak(gateway.url, gateway.proc.pid, args, console))
        figures["gateway_log"] = log_findings(log_path)
    figures["args"] = {key: str(value) for key, value in vars(args).items()}
    report(figures, console)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        console.print(f"written to {args.out}")
    return 1 if any(lane["failures"] for lane in figures["lanes"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
