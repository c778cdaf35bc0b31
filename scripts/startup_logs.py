"""Replay public vLLM start-up logs through ocrserve's planner and print how close it comes.

``tests/data/vllm_startup_logs.json`` holds each log's URL, vLLM version, GPU, flags and the figures
vLLM printed ("Model loading took", "Available KV cache memory", "GPU KV cache size", a refused
start-up). For every record whose model, GPU and release the planner follows, this runs
:func:`ocrserve.gpu.planner.predict_startup` with the logged flags and prints, per record, the
predicted and logged weights and KV-cache tokens and the error in percent, then the median and
worst error. ``tests/test_startup_logs.py`` asserts the same (KV tokens within 10%, weights within
3%, refused start-ups refused).

Usage::

    python scripts/startup_logs.py            # markdown table on stdout
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ocrserve.gpu.memory import Startup, predict_startup
from ocrserve.gpu.registry import GIB, GpuSpec, lookup
from ocrserve.models import ModelSpec, get_model

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm_startup_logs.json"


@dataclass(frozen=True)
class Replay:
    """One record next to the planner's prediction for it.

    Attributes:
        record: the log record.
        weights: the planner's weights per GPU, bytes.
        startup: the predicted start-up (``None`` for a record checked on its weights alone).
    """

    record: dict
    weights: int
    startup: Startup | None

    @property
    def weights_error(self) -> float | None:
        """Predicted / logged weights - 1 (``None`` without a logged figure)."""
        logged = self.record["logged"]["weights_gib"]
        return self.weights / GIB / logged - 1 if logged else None

    @property
    def kv_error(self) -> float | None:
        """Predicted / logged KV-cache tokens - 1 (``None`` where the record is not checked for it)."""
        logged = self.record["logged"]["kv_tokens"]
        if "kv" not in self.record["checks"] or not logged:
            return None
        return self.startup.kv_tokens / logged - 1


def load(path: Path = DATA) -> dict:
    """The data file: ``configs`` (model id -> config.json fields and their source) and ``records``."""
    return json.loads(path.read_text())


def model_spec(model: str, configs: dict, folder: Path) -> ModelSpec:
    """The registry entry for ``model``, or a spec read from its config written into ``folder``."""
    if model not in configs:
        return get_model(model)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(configs[model]["config"]))
    return get_model(str(folder))


def gpu_spec(record: dict) -> GpuSpec:
    """The record's GPU: a registry name, or its CUDA total as the log printed it."""
    if record["gpu"]:
        return lookup(record["gpu"])
    return GpuSpec(record["gpu_logged"], int(record["gpu_total_gib"] * 1024), (9, 0), 0.0)


def replay(record: dict, configs: dict, folder: Path) -> Replay:
    """Predict the record's start-up with its own flags (weights-only records are compared on their
    weights alone)."""
    flags = record["flags"]
    spec = model_spec(record["model"], configs, folder)
    if record["checks"] == ["weights"]:
        return Replay(record, spec.weights_bytes // flags.get("tensor_parallel_size", 1), None)
    startup = predict_startup(
        spec,
        gpu_spec(record),
        max_model_len=flags["max_model_len"],
        max_num_seqs=flags["max_num_seqs"],
        max_num_batched_tokens=flags["max_num_batched_tokens"],
        gpu_memory_utilization=flags["gpu_memory_utilization"],
        tensor_parallel_size=flags["tensor_parallel_size"],
        kv_cache_dtype=flags["kv_cache_dtype"],
        enforce_eager=flags["enforce_eager"],
        vllm_version=record["vllm_version"],
        flashinfer_sampler=record["sampler"] == "flashinfer",
    )
    return Replay(record, startup.weights, startup)


def replay_all(data: dict) -> list[Replay]:
    """Every checked record's replay, in file order."""
    with tempfile.TemporaryDirectory() as tmp:
        return [
            replay(record, data["configs"], Path(tmp) / str(index))
            for index, record in enumerate(data["records"])
            if record["checks"]
        ]


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:+.1%}"


def table(replays: list[Replay]) -> str:
    """A markdown table of the replays and a line with the median and worst errors."""
    lines = [
        "| model | GPU | vLLM | flags | weights GiB (planned / logged) | KV tokens (planned / logged), or start-up |",
        "|---|---|---|---|---|---|",
    ]
    for rep in replays:
        rec, start, logged = rep.record, rep.startup, rep.record["logged"]
        flags = rec["flags"]
        shown = ", ".join(
            f"{k}={v}"
            for k, v in flags.items()
            if v not in ("auto", False) and not (k == "tensor_parallel_size" and v == 1)
        )
        if "failure" in rec["checks"]:
            kv = "refused, as vLLM did" if start.error else "**not refused**"
        elif rep.kv_error is not None:
            kv = f"{start.kv_tokens:,} / {logged['kv_tokens']:,} ({_pct(rep.kv_error)})"
        else:
            kv = "-"
        weights = (
            f"{rep.weights / GIB:.2f} / {logged['weights_gib']:.2f} ({_pct(rep.weights_error)})"
            if logged["weights_gib"]
            else f"{rep.weights / GIB:.2f} / -"
        )
        gpu = rec["gpu"] or rec["gpu_logged"]
        lines.append(f"| [{rec['model']}]({rec['url']}) | {gpu} | {rec['vllm_version']} | {shown} | {weights} | {kv} |")
    kv_errors = [abs(r.kv_error) for r in replays if r.kv_error is not None]
    w_errors = [abs(r.weights_error) for r in replays if r.weights_error is not None]
    failures = [r for r in replays if "failure" in r.record["checks"]]
    lines.append("")
    lines.append(f"Failed start-ups: {sum(bool(r.startup.error) for r in failures)} of {len(failures)} refused.")
    lines.append(
        f"KV tokens: {len(kv_errors)} logs, median error {statistics.median(kv_errors):.1%}, "
        f"worst {max(kv_errors):.1%}; weights: {len(w_errors)} logs, median {statistics.median(w_errors):.1%}, "
        f"worst {max(w_errors):.1%}."
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="the start-up log records (JSON)")
    args = parser.parse_args()
    data = load(args.data)
    print(f"{len(data['records'])} records in {args.data.name}; replaying the checked ones\n")
    print(table(replay_all(data)))


if __name__ == "__main__":
    main()
