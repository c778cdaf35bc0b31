"""The bench report: the sweep's points, its knee and recommendation, quality against batch 1 and
ground truth, cost figures; written as JSON, CSV, a PNG plot and (for server-side sweeps) a
profile overlay that ``ocrserve launch --set-file`` applies.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path

import yaml

from ocrserve.bench.analysis import Point, curves
from ocrserve.bench.capacity import ServiceModel, simulate
from ocrserve.bench.harness import percentile
from ocrserve.config import assign
from ocrserve.evaluation import cer

#: Columns of ``report.csv``: a point's summary figures (``Measurement.summary``).
CSV_COLUMNS = [
    "setting",
    "mode",
    "value",
    "seconds",
    "requests",
    "pages_per_s",
    "p50_s",
    "p95_s",
    "p99_s",
    "queue_p50_s",
    "queue_p95_s",
    "engine_p50_s",
    "offered_pages_per_s",
    "statuses",
]


def quality(baseline: dict[str, str], candidate: dict[str, str], truths: dict[str, str]) -> dict:
    """Character error rates: ``candidate``'s texts against ``baseline``'s (the same documents at
    batch 1), and each against ground truth where there is one; means over the documents both
    have. ``drift`` is the mean CER between the two outputs."""
    shared = sorted(set(baseline) & set(candidate))
    drift = {d: cer(candidate[d], baseline[d]) for d in shared}
    scored = [d for d in shared if d in truths]
    return {
        "documents": len(shared),
        "drift_cer": round(statistics.fmean(drift.values()), 4) if drift else None,
        "worst": max(drift, key=drift.__getitem__, default=None),
        "baseline_cer_vs_truth": _mean_cer([baseline[d] for d in scored], [truths[d] for d in scored]),
        "candidate_cer_vs_truth": _mean_cer([candidate[d] for d in scored], [truths[d] for d in scored]),
        "scored_documents": len(scored),
    }


def _mean_cer(texts: list[str], truths: list[str]) -> float | None:
    return round(statistics.fmean(cer(t, g) for t, g in zip(texts, truths, strict=True)), 4) if texts else None


def cost(point: Point, cost_per_hour: float | None) -> dict:
    """Pages an hour at ``point``, and with ``cost_per_hour`` the cost of 1000 pages."""
    per_hour = point.pages_per_s * 3600
    figures = {"pages_per_hour": round(per_hour)}
    if cost_per_hour is not None and per_hour > 0:
        figures["cost_per_1000_pages"] = round(cost_per_hour / per_hour * 1000, 4)
    return figures


def write(report: dict, out: Path) -> list[Path]:
    """``report.json``, ``report.csv``, ``report.png`` and, for a server-side recommendation,
    ``recommended.yaml`` under ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.json", out / "report.csv", out / "report.png"]
    written[0].write_text(json.dumps(report, indent=2, ensure_ascii=False))
    with written[1].open("w", newline="") as fh:
        rows = csv.DictWriter(fh, CSV_COLUMNS, extrasaction="ignore")  # completion_tokens: report.json only
        rows.writeheader()
        for point in report["points"]:
            rows.writerow(point | {"statuses": json.dumps(point["statuses"])})
    plot(report, written[2])
    if report.get("overlay"):
        written.append(out / "recommended.yaml")
        written[-1].write_text(yaml.safe_dump(overlay_yaml(report["overlay"]), sort_keys=False))
    return written


def write_mixed(rows: list[dict], out: Path) -> list[Path]:
    """The mixed scenario's runs (one per setting) as ``mixed.json`` and ``mixed.csv`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "mixed.json", out / "mixed.csv"]
    written[0].write_text(json.dumps({"scenario": "mixed", "runs": rows}, indent=2))
    with written[1].open("w", newline="") as fh:
        table = csv.DictWriter(fh, list(rows[0]))
        table.writeheader()
        table.writerows(rows)
    return written


def overlay_yaml(settings: dict[str, object]) -> dict:
    """Dotted keys (``vllm.max_num_seqs``) as the nested mapping of a profile (:func:`~ocrserve.config.assign`)."""
    nested: dict = {}
    for key, value in settings.items():
        assign(nested, key.split("."), value)
    return nested


def plot(report: dict, path: Path) -> None:
    """Throughput and p95 of the closed-loop points against the swept value (a line per setting of
    the other swept keys), the knee and the p95 target marked."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    values = []
    closed = (p for p in report["points"] if p["mode"] == "closed")
    for label, points in curves(closed, lambda p: p["setting"], lambda p: p["value"]).items():
        values += [p["value"] for p in points]
        x = [p["value"] for p in points]
        top.plot(x, [p["pages_per_s"] for p in points], "o-", label=label or None)
        bottom.plot(x, [math.nan if p["p95_s"] is None else p["p95_s"] for p in points], "o-", label=label or None)
    top.set_ylabel("pages/s")
    bottom.set_ylabel("p95 latency, s")
    bottom.set_xlabel(report["swept"])
    if len(values) > 1 and min(values) > 0 and max(values) / min(values) >= 8:
        bottom.set_xscale("log", base=2)
    knee = report["knee"]["value"]
    for axis in (top, bottom):
        axis.axvline(knee, color="grey", linestyle="--", label=f"knee ({knee:g})")
        axis.grid(alpha=0.3)
    if report.get("p95_target_s"):
        bottom.axhline(report["p95_target_s"], color="tab:green", linestyle=":", label="p95 target")
    if report.get("recommendation"):
        chosen = report["recommendation"]
        top.plot([chosen["value"]], [chosen["pages_per_s"]], "*", markersize=14, color="tab:green", label="recommended")
    top.legend(loc="lower right")
    bottom.legend(loc="upper left")
    fig.suptitle(report["title"], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_capacity(model: ServiceModel, p95: float, path: Path) -> None:
    """``ocrserve capacity --plot``: a replica's simulated p95 against its arrival rate, from 10% to
    95% of the rate the model sustains, with the target marked."""
    plt = _pyplot()
    rates = [model.max_rate * f for f in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)]
    predicted = [percentile(simulate(model, r, pages=5000), 95) for r in rates]
    fig, axis = plt.subplots(figsize=(7, 4))
    axis.plot(rates, predicted, "o-", label="simulated p95")
    axis.axhline(p95, color="tab:green", linestyle=":", label="target")
    axis.set_xlabel("arrival rate per replica, pages/s")
    axis.set_ylabel("p95 latency, s")
    axis.grid(alpha=0.3)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot():
    """matplotlib's pyplot on the Agg backend (files only: no display is needed or used)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
