"""``ocrserve bench`` (measure a gateway with real documents, find the knee, recommend a setting) and
``ocrserve capacity`` (replicas and predicted latency for an arrival rate)."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ocrserve.bench.analysis import KNEE_GAIN, curves, knee, recommend
from ocrserve.bench.capacity import TARGET_UTILIZATION, ServiceModel, Work, in_flight, replicas, serve, simulate
from ocrserve.bench.harness import LocalGateway, percentile
from ocrserve.bench.load import (
    LoadDocument,
    Measurement,
    closed_loop,
    count_pages,
    http_client,
    load_documents,
    open_loop,
)
from ocrserve.bench.mixed import mixed
from ocrserve.bench.report import cost, plot_capacity, quality, write, write_mixed
from ocrserve.cli.common import Overrides, documents_or_exit, err_console, require_extra
from ocrserve.cli.plan import gpu_plan, profile_settings
from ocrserve.gpu.lengths import LengthsError
from ocrserve.gpu.planner import PlanError
from ocrserve.gpu.registry import GpuError
from ocrserve.models import ModelError

#: Longest wait for a started gateway's /readyz, seconds: one that launches vLLM (cpu-vllm on 2 busy
#: cores) took 100 s; one that exits is noticed at once.
GATEWAY_START_S = 900.0
#: Requests in flight at once in an open-loop point, at most (arrivals beyond it wait for a connection).
OPEN_LOOP_CONNECTIONS = 256


def _numbers(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        err_console.print(f"[red]error:[/red] {what} must be a comma-separated list of positive numbers, got {text!r}")
        raise typer.Exit(2)
    return values


def _sweep(spec: str) -> tuple[str, list[str]]:
    key, _, values = spec.partition("=")
    if not key or not values:
        err_console.print(f"[red]error:[/red] --sweep takes KEY=V1,V2,..., got {spec!r}")
        raise typer.Exit(2)
    return key, [v for v in values.split(",") if v]


def _grid(specs: list[str]) -> list[str]:
    """Every combination of the ``--sweep`` values, each ``KEY=VALUE`` joined by spaces, the first
    key's values varying fastest within each combination of the others (no specs: none).

    Example: ``["a=1,2", "b=x,y"]`` -> ``["a=1 b=x", "a=2 b=x", "a=1 b=y", "a=2 b=y"]``.
    """
    if not specs:
        return []
    axes = [_sweep(spec) for spec in specs]
    key, values = axes[0]
    others = itertools.product(*([f"{k}={v}" for v in vs] for k, vs in axes[1:]))
    return [" ".join([f"{key}={v}", *rest]) for rest in others for v in values]


def _truths(found: dict[Path, Path]) -> dict[str, str]:
    """Ground truth beside each document (``NAME.gt.txt``, as in ``../shared/corpus``), by name."""
    truths = {}
    for path, name in found.items():
        gt = path.with_name(path.name.rsplit(".", 1)[0] + ".gt.txt")
        if gt.is_file():
            truths[str(name)] = gt.read_text(encoding="utf-8")
    return truths


def _progress(points: int) -> tuple[Progress, Callable[[str], Callable]]:
    """A bar over the run's ``points``; ``point(label)`` starts the next one and returns its
    per-request callback (the bar shows the point's label and requests so far)."""
    progress = Progress(
        TextColumn("[bold]bench"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("points"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err_console,
    )
    task = progress.add_task("", total=points)
    started = [0]

    def point(label: str) -> Callable:
        progress.update(task, completed=started[0])
        started[0] += 1
        done = [0]

        def tick(outcome) -> None:
            done[0] += 1
            progress.update(task, description=f"{label}: {done[0]} requests")

        return tick

    progress.start()
    return progress, point


def _stop(progress: Progress) -> None:
    """End the bar, its points all counted."""
    for task in progress.tasks:
        progress.update(task.id, completed=task.total)
    progress.stop()


async def _client_sweep(url: str, documents: list[LoadDocument], run: Run, point) -> list[Measurement]:
    measured = []
    async with http_client(url, OPEN_LOOP_CONNECTIONS, run.api_key) as client:
        documents = await count_pages(client, documents)
        for c in run.concurrencies:
            measured.append(await closed_loop(client, documents, int(c), run.duration, point(f"concurrency {c:g}")))
        for r in run.rates:
            measured.append(await open_loop(client, documents, r, run.duration, tick=point(f"rate {r:g} pages/s")))
    return measured


async def _server_point(url, documents: list[LoadDocument], concurrency: int, seconds: float, setting: str, point):
    async with http_client(url, concurrency) as client:
        documents = await count_pages(client, documents)
        measurement = await closed_loop(client, documents, concurrency, seconds, point(setting))
    measurement.setting = setting
    return measurement


def bench(
    corpus: Annotated[
        list[Path],
        typer.Option(metavar="DIR|FILE", help="Documents to send (folders searched recursively; repeatable)."),
    ],
    url: Annotated[
        str | None, typer.Option(metavar="URL", help="A running gateway; without it (or with --sweep) one is started.")
    ] = None,
    profile: Annotated[str, typer.Option(metavar="NAME|PATH", help="Profile of the gateways started here.")] = "local",
    set_: Overrides = None,
    sweep: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=V1,V2",
            help="Server-side sweep: start the gateway once per value of KEY (repeatable: every combination; "
            "the first KEY is the curve's axis).",
        ),
    ] = None,
    concurrency: Annotated[
        str, typer.Option(metavar="LIST", help="Closed loop: requests in flight (with --sweep: the largest is used).")
    ] = "1,2,4,8,16,32",
    rate: Annotated[str | None, typer.Option(metavar="LIST", help="Open loop: Poisson arrivals, pages/s.")] = None,
    duration: Annotated[float, typer.Option(min=1, metavar="S", help="Seconds of load per point.")] = 30.0,
    p95: Annotated[
        float | None, typer.Option(min=0, metavar="S", help="Latency target: recommend the best setting meeting it.")
    ] = None,
    knee_gain: Annotated[
        float, typer.Option(min=0, metavar="FRACTION", help="A step adding less throughput is past the knee.")
    ] = KNEE_GAIN,
    max_cer_drift: Annotated[
        float,
        typer.Option(min=0, metavar="CER", help="Flag (exit 1) a recommendation whose text drifts more from batch 1."),
    ] = 0.02,
    cost_per_hour: Annotated[float | None, typer.Option(min=0, metavar="PRICE", help="Machine cost an hour.")] = None,
    out: Annotated[Path, typer.Option(metavar="DIR", help="Where report.json, .csv, .png go.")] = Path("bench-report"),
    api_key: Annotated[
        str | None, typer.Option(envvar="OCRSERVE_API_KEY", metavar="KEY", help="API key of --url.")
    ] = None,
    scenario: Annotated[
        str, typer.Option(metavar="NAME", help="sweep (the batch-size curve) or mixed (interactive over a bulk flood).")
    ] = "sweep",
    interval: Annotated[
        float, typer.Option(min=0.1, metavar="S", help="mixed: seconds between interactive pages.")
    ] = 5.0,
) -> None:
    """Measure throughput and latency with real documents, find the knee, recommend a setting.

    Closed loop: --concurrency requests in flight, each point --duration seconds. Open loop
    (--rate): Poisson arrivals offering that many pages/s, whose measured p95 is printed beside the
    capacity simulator's prediction. With --sweep the gateway is started once per value (on the
    --profile, with the --set items) and loaded at the largest --concurrency: the server-side batch-size curve. Several
    --sweep options run every combination: one curve along the first KEY per setting of the others.

    The knee is where one more step adds less than --knee-gain of throughput; with --p95 the
    recommendation is the setting with the highest throughput whose p95 meets it. The texts at the
    smallest setting (batch 1) and at the recommendation (else the knee) are compared (CER, and
    against NAME.gt.txt beside a document); a drift above --max-cer-drift exits 1.

    --scenario mixed measures the lanes instead: a single-page document of --corpus sent every
    --interval seconds (priority=interactive) alone, then the documents posted by the largest
    --concurrency of clients as priority=bulk alone, then both, each phase --duration seconds; it
    reports the interactive p95 under the flood against idle and bulk pages/s with the stream
    against without (with --sweep: per value, e.g. router.mode=lanes,fifo).

    Examples:

        ocrserve bench --url http://127.0.0.1:8000 --corpus ../shared/corpus/tesseract --p95 5

        ocrserve bench --corpus scans/ --concurrency 1,2,4,8 --rate 1,2 --duration 60

        ocrserve bench --corpus scans/ --sweep engine.onnx.rec_batch_num=1,6,16 --concurrency 8 --p95 10

        ocrserve bench --corpus scans/ --sweep engine.onnx.rec_batch_num=1,6 --sweep engine.onnx.det_workers=1,2

        ocrserve bench --corpus scans/ --scenario mixed --sweep router.mode=lanes,fifo --concurrency 4 --duration 60
    """
    if scenario not in ("sweep", "mixed"):
        err_console.print(f"[red]error:[/red] --scenario must be sweep or mixed, got {scenario!r}")
        raise typer.Exit(2)
    require_extra("bench", "ocrserve bench (the report's plot and quality check)")
    found = documents_or_exit(corpus)
    documents = load_documents(found)
    run = Run(
        url,
        profile,
        sweep or [],
        _numbers(concurrency, "--concurrency"),
        _numbers(rate, "--rate") if rate else [],
        duration,
        api_key,
        interval,
        list(set_ or []),
    )
    try:
        if scenario == "mixed":
            _bench_mixed(documents, run, out)
        else:
            _bench_sweep(documents, run, p95, knee_gain, max_cer_drift, cost_per_hour, _truths(found), out)
    except typer.Exit:  # click's Exit is a RuntimeError too
        raise
    except RuntimeError as exc:  # a gateway that would not start, a document it would not read
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None


@dataclass(frozen=True)
class Run:
    """What the load runs against and how (``ocrserve bench``'s options)."""

    url: str | None
    profile: str
    sweep: list[str]
    concurrencies: list[float]
    rates: list[float]
    duration: float
    api_key: str | None
    interval: float
    overrides: list[str] = field(default_factory=list)
    """``--set`` items for every gateway started here (before the swept setting's)."""

    @property
    def clients(self) -> int:
        """The largest concurrency: the load of a server-side sweep, the flood's clients."""
        return int(max(self.concurrencies))


def _bench_mixed(documents: list[LoadDocument], run: Run, out: Path) -> None:
    settings = _grid(run.sweep) or [""]
    rows = [_mixed_run(run, setting, documents) for setting in settings]
    _print_mixed(rows)
    for path in write_mixed(rows, out):
        err_console.print(f"wrote {path}")


def _bench_sweep(documents, run: Run, p95, knee_gain, max_cer_drift, cost_per_hour, truths, out: Path) -> None:
    if run.sweep:
        key, values = _sweep(run.sweep[0])
        _numbers(",".join(values), f"--sweep {key} (the curve's axis, so its knee, needs numbers)")
        measured = _run_sweep(run, _grid(run.sweep), documents)
        swept, title = key, f"{key} at concurrency {run.clients}"
    else:
        measured = _run_client(run, documents)
        swept, title = "concurrency", f"concurrency sweep of {run.url or 'a local gateway (' + run.profile + ')'}"
    report = _report(measured, swept, title, p95, knee_gain, cost_per_hour, truths, max_cer_drift)
    _print(report)
    for path in write(report, out):
        err_console.print(f"wrote {path}")
    raise typer.Exit(1 if report["quality"].get("flagged") else 0)


def _mixed_run(run: Run, setting: str, documents: list[LoadDocument]) -> dict:
    """The mixed scenario against ``run.url``, or a gateway started for ``setting`` (or when no url)."""
    started = setting or not run.url
    gateway = (
        LocalGateway(*run.overrides, *setting.split(), profile=run.profile).wait_ready(GATEWAY_START_S)
        if started
        else None
    )
    progress, point = _progress(1)
    try:
        figures = asyncio.run(_mixed_async(gateway.url if gateway else run.url, documents, run, point))
    finally:
        _stop(progress)
        if gateway:
            gateway.stop()
    return {"setting": setting} | figures


async def _mixed_async(url: str, documents: list[LoadDocument], run: Run, point) -> dict:
    async with http_client(url, run.clients + 1, run.api_key) as client:
        documents = await count_pages(client, documents)
        singles = [d for d in documents if d.pages == 1]
        if not singles:
            err_console.print("[red]error:[/red] --scenario mixed needs a single-page document in --corpus")
            raise typer.Exit(2)
        page = min(singles, key=lambda d: len(d.data))
        return await mixed(client, page, documents, run.clients, run.interval, run.duration, point("mixed"))


def _print_mixed(rows: list[dict]) -> None:
    table = Table(
        "setting",
        "n",
        "p95 idle",
        "p95 flood",
        "x",
        "bulk/s",
        "+stream",
        "x",
        "errors",
        title="interactive pages (n idle / under the flood; p95 s) over a bulk flood (pages/s)",
    )
    for r in rows:
        table.add_row(
            r["setting"].partition("=")[2] or "-",
            f"{r['interactive_idle_n']} / {r['interactive_loaded_n']}",
            _s(r["interactive_idle_p95_s"]),
            _s(r["interactive_loaded_p95_s"]),
            f"{r['p95_ratio']:.2f}",
            f"{r['bulk_alone_pages_per_s']:.2f}",
            f"{r['bulk_with_stream_pages_per_s']:.2f}",
            f"{r['bulk_ratio']:.2f}",
            str(r["errors"]),
        )
    Console().print(table)


def _run_client(run: Run, documents: list[LoadDocument]) -> list[Measurement]:
    gateway = None if run.url else LocalGateway(*run.overrides, profile=run.profile).wait_ready(GATEWAY_START_S)
    progress, point = _progress(len(run.concurrencies) + len(run.rates))
    try:
        return asyncio.run(_client_sweep(run.url or gateway.url, documents, run, point))
    finally:
        _stop(progress)
        if gateway:
            gateway.stop()


def _run_sweep(run: Run, settings: list[str], documents: list[LoadDocument]) -> list[Measurement]:
    measured = []
    progress, point = _progress(len(settings))
    try:
        for setting in settings:
            gateway = LocalGateway(*run.overrides, *setting.split(), profile=run.profile)
            try:
                gateway.wait_ready(GATEWAY_START_S)
                measurement = asyncio.run(
                    _server_point(gateway.url, documents, run.clients, run.duration, setting, point)
                )
            finally:
                gateway.stop()
            measurement.value = float(setting.split()[0].partition("=")[2])
            measured.append(measurement)
    finally:
        _stop(progress)
    return measured


def _report(measured, swept, title, p95_target, gain, cost_per_hour, truths, max_drift) -> dict:
    closed = [m for m in measured if m.mode == "closed"]
    by_curve = curves(closed, lambda m: m.setting, lambda m: m.value)
    bends = {label: knee([m.point() for m in points], gain) for label, points in by_curve.items()}
    chosen = recommend([m.point() for m in closed], p95_target) if p95_target is not None else None
    best = chosen or max(bends.values(), key=lambda p: p.pages_per_s)
    curve = best.setting.partition(" ")[2]
    bend = bends[curve]
    target = chosen or bend
    by_point = {(m.setting, m.value): m for m in closed}
    baseline = by_curve[curve][0]
    check = quality(baseline.texts, by_point[target.setting, target.value].texts, truths)
    check["flagged"] = check["drift_cer"] is not None and check["drift_cer"] > max_drift
    check["max_cer_drift"] = max_drift
    report = {
        "title": title,
        "swept": swept,
        "points": [m.summary() for m in measured],
        "knee": _figures(bend) | {"gain": gain},
        "p95_target_s": p95_target,
        "recommendation": None if chosen is None else _figures(chosen),
        "quality": check | {"baseline": baseline.value, "candidate": target.value},
        "cost": cost(target, cost_per_hour) | ({"per_hour": cost_per_hour} if cost_per_hour is not None else {}),
    }
    if len(by_curve) > 1:
        report["knees"] = [_figures(p) for p in bends.values()]
    if chosen is not None and chosen.setting:
        report["overlay"] = {k: _number(v) for k, _, v in (s.partition("=") for s in chosen.setting.split())}
    if swept == "concurrency" and len(closed) >= 2:
        model, documents = _fit(closed, bend.value)
        report["service_model"] = {"a": model.a, "b": model.b, "max_batch": model.max_batch, "documents": documents}
        report["open_loop"] = [_predicted(m, model, documents) for m in measured if m.mode == "open"]
    return report


def _figures(point) -> dict:
    """A point's figures in the report: its value, settings, pages/s and p95."""
    return {"value": point.value, "setting": point.setting, "pages_per_s": point.pages_per_s, "p95_s": point.p95_s}


def _fit(closed: list[Measurement], knee_value: float) -> tuple[ServiceModel, dict[str, Work]]:
    """The engine's ``T(B)`` from the closed-loop points up to the knee (past it, more in flight only
    queues: it batches no more; at least the two lowest), and the documents' work factors from the
    lowest concurrency (by name, for replays)."""
    ordered = sorted((m for m in closed if m.pages_per_s > 0), key=lambda m: m.value)
    batching = [m for m in ordered if m.value <= knee_value]
    batching = batching if len(batching) >= 2 else ordered[:2]
    documents = _work(ordered[0])
    return ServiceModel.fit([(int(m.value), m.pages_per_s) for m in batching], list(documents.values())), documents


def _work(lowest: Measurement) -> dict[str, Work]:
    """Each document's pages' work factors (:mod:`ocrserve.bench.capacity`): its mean end-to-end
    seconds at the lowest concurrency (alone, at concurrency 1), shared by its pages, over the mean
    page's seconds there."""
    done = [o for o in lowest.outcomes if o.status == 200 and o.pages]
    mean_page = sum(o.seconds for o in done) / sum(o.pages for o in done)
    seconds: dict[str, list[float]] = {}
    for o in done:
        seconds.setdefault(o.document, []).append(o.seconds / o.pages / mean_page)
    pages = {o.document: o.pages for o in done}
    return {name: (sum(f) / len(f),) * pages[name] for name, f in seconds.items()}


def _predicted(measurement: Measurement, model: ServiceModel, documents: dict[str, Work]) -> dict:
    """An open-loop point's measured p95 beside the simulator's: in steady state at the pages/s the
    point offered, and replaying the point's own arrivals (when each document was sent)."""
    try:
        simulated = percentile(simulate(model, measurement.offered), 95)
    except ValueError:  # at or past the model's capacity: no steady state to predict
        simulated = math.inf
    sent = sorted((o.sent_s, documents.get(o.document, (1.0,))) for o in measurement.outcomes)
    return {
        "rate": measurement.value,
        "offered_pages_per_s": round(measurement.offered, 4),
        "measured_p95_s": measurement.latency(95),
        "simulated_p95_s": simulated,
        "replayed_p95_s": percentile(serve(model, sent), 95),
    }


def _number(text: str) -> int | float | str:
    """A setting's value as YAML should hold it: an int, a float, else the text (``lanes``)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _print(report: dict) -> None:
    console = Console()
    table = Table(
        report["swept"] if report["swept"] != "concurrency" else "point",
        "pages/s",
        "p50 s",
        "p95 s",
        "p99 s",
        "queue p95 s",
        "statuses",
        title=report["title"],
    )
    for p in report["points"]:
        table.add_row(
            _label(p) if p["setting"] else f"{p['mode']} {p['value']:g}",
            f"{p['pages_per_s']:.2f}",
            _s(p["p50_s"]),
            _s(p["p95_s"]),
            _s(p["p99_s"]),
            _s(p["queue_p95_s"]),
            json.dumps(p["statuses"]),
        )
    console.print(table)
    closed = [p for p in report["points"] if p["mode"] == "closed"]
    for k in report.get("knees", [report["knee"]]) if len(closed) > 1 else []:  # one point has no knee
        console.print(
            f"knee: {report['swept']} = {_label(k)} ({k['pages_per_s']:.2f} pages/s, p95 {_s(k['p95_s'])} s; "
            f"the next step adds < {report['knee']['gain']:.0%})"
        )
    chosen = report["recommendation"]
    if report["p95_target_s"] is not None:
        if chosen:
            console.print(
                f"recommended for p95 <= {report['p95_target_s']:g} s: {report['swept']} = {_label(chosen)} "
                f"({chosen['pages_per_s']:.2f} pages/s, p95 {chosen['p95_s']:.2f} s)"
            )
        else:
            console.print(f"[yellow]no setting meets p95 <= {report['p95_target_s']:g} s[/yellow]")
    if report.get("overlay"):
        console.print("profile keys: " + " ".join(f"--set {k}={v}" for k, v in report["overlay"].items()))
    q = report["quality"]
    drift = "n/a" if q["drift_cer"] is None else f"{q['drift_cer']:.4f}"
    compared = (
        f"CER {report['swept']} {q['candidate']:g} vs {q['baseline']:g}: {drift} over {q['documents']} documents "
        f"(limit {q['max_cer_drift']:g}){' [red]FLAGGED[/red]' if q['flagged'] else ''}"
        if q["candidate"] != q["baseline"]
        else f"{report['swept']} {q['baseline']:g} is the smallest setting, nothing to compare it with"
    )
    console.print(
        f"quality: {compared}; vs ground truth {_s(q['candidate_cer_vs_truth'])} ({q['scored_documents']} documents)"
    )
    figures = report["cost"]
    console.print(
        f"cost: {figures['pages_per_hour']:,} pages/hour"
        + (f", {figures['cost_per_1000_pages']:.4f} per 1000 pages" if "cost_per_1000_pages" in figures else "")
    )
    for row in report.get("open_loop", []):
        measured = row["measured_p95_s"]
        console.print(
            f"open loop {row['rate']:g} pages/s ({row['offered_pages_per_s']:.3f} offered): measured p95 "
            f"{_s(measured)} s; simulated at {row['offered_pages_per_s']:.3f} pages/s {_s(row['simulated_p95_s'])} s "
            f"({_error(row['simulated_p95_s'], measured)}); its arrivals replayed {_s(row['replayed_p95_s'])} s "
            f"({_error(row['replayed_p95_s'], measured)})"
        )


def _error(predicted: float, measured: float) -> str:
    """A prediction's error relative to the measurement, e.g. ``+12%``."""
    return f"{predicted / measured - 1:+.0%}" if measured and math.isfinite(predicted) else "-"


def _label(point: dict) -> str:
    """A point by its swept value, with the other swept keys' settings where there are some."""
    return " ".join([f"{point['value']:g}", *point["setting"].split()[1:]])


def _s(value: float | None) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def capacity(
    rate: Annotated[float, typer.Option(min=0, metavar="PAGES_PER_S", help="Arrival rate to plan for.")],
    p95: Annotated[float, typer.Option(min=0, metavar="S", help="Latency target, seconds.")],
    from_bench: Annotated[
        Path | None,
        typer.Option(metavar="REPORT", help="report.json of `ocrserve bench` (its fitted T(B) = a + b x B)."),
    ] = None,
    a: Annotated[
        float | None, typer.Option(min=0, metavar="S", help="T(B)'s fixed seconds (without --from-bench).")
    ] = None,
    b: Annotated[
        float | None, typer.Option(min=0, metavar="S", help="T(B)'s seconds a page (without --from-bench).")
    ] = None,
    max_batch: Annotated[int | None, typer.Option(min=1, metavar="N", help="Pages an engine runs at once.")] = None,
    utilization: Annotated[
        float, typer.Option(min=0.01, max=1.0, metavar="RHO", help="Utilization planned per replica.")
    ] = TARGET_UTILIZATION,
    plot: Annotated[
        Path | None, typer.Option(metavar="PNG", help="Plot predicted p95 against arrival rate here.")
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            help="Predict T(B) for this GPU with the model of vLLM's scheduler instead of measuring it "
            "(no --from-bench); a registry GPU, e.g. 'H100 80GB'."
        ),
    ] = None,
    model_id: Annotated[
        str | None, typer.Option("--model", help="With --gpu: the registry model (default HunyuanOCR).")
    ] = None,
    output_lengths: Annotated[
        str | None,
        typer.Option(help="With --gpu: output tokens per page, a bench report or a corpus (default: the prior)."),
    ] = None,
    overflow: Annotated[
        float | None,
        typer.Option(min=0.0, max=0.999, help="With --gpu: plan --max-num-seqs statistically at this overflow chance."),
    ] = None,
    profile: Annotated[
        str, typer.Option(help="With --gpu: the profile ocrserve plan reads (pixel budget, vllm settings).")
    ] = "prod",
) -> None:
    """Replicas and predicted latency for an arrival rate.

    One replica sustains mu = max_batch / T(max_batch) pages/s at most; the plan is N = ceil(rate /
    (mu x utilization)) replicas, each offered rate / N, and a discrete-event simulation of the
    batch server (T(B) = a + b x B) predicts each one's p95; Little's law gives the pages in flight.

    T(B) comes from a bench report, from --a/--b/--max-batch, or, with --gpu, from the model of
    vLLM's scheduler (ocrserve plan's prediction: KV-block admission, decode steps from the GPU's
    memory bandwidth, preemption) run at 1, 2, 4, ... pages in flight up to the plan's
    --max-num-seqs: a prediction, no GPU ran it.

    Examples:

        ocrserve capacity --rate 20 --p95 5 --from-bench bench-report/report.json

        ocrserve capacity --rate 3 --p95 2 --a 0.2 --b 0.15 --max-batch 2 --plot p95.png

        ocrserve capacity --rate 10 --p95 120 --gpu "H100 80GB" --overflow 0.01
    """
    if plot:
        require_extra("bench", "ocrserve capacity --plot")
    if gpu:
        if from_bench or a is not None or b is not None or max_batch is not None:
            err_console.print(
                "[red]error:[/red] --gpu predicts T(B); it takes no --from-bench, --a, --b or --max-batch"
            )
            raise typer.Exit(2)
        model = _predicted_model(profile, gpu, model_id, output_lengths, overflow)
    else:
        model = _model(from_bench, a, b, max_batch)
    count = replicas(rate, model.max_rate, utilization)
    while True:
        try:
            latencies = simulate(model, rate / count) if rate > 0 else [model.seconds(1)]
        except ValueError:
            count += 1
            continue
        if percentile(latencies, 95) <= p95 or count >= 10_000:
            break
        count += 1
    predicted = percentile(latencies, 95)
    mean = sum(latencies) / len(latencies)
    console = Console()
    console.print(
        f"engine: T(B) = {model.a:.4f} + {model.b:.4f} x B s, at most {model.max_batch} pages at once: "
        f"{model.max_rate:.3f} pages/s"
    )
    console.print(
        f"replicas: {count} (ceil({rate:g} / ({model.max_rate:.3f} x {utilization:g})) = "
        f"{replicas(rate, model.max_rate, utilization)}, then as many as the p95 needs)"
    )
    console.print(
        f"each replica: {rate / count:.3f} pages/s, simulated p95 {predicted:.3f} s (target {p95:g} s), "
        f"mean {mean:.3f} s"
    )
    console.print(f"in flight (Little's law): {in_flight(rate, mean):.1f} pages across the fleet")
    if plot:
        plot_capacity(model, p95, plot)
        console.print(f"wrote {plot}")
    raise typer.Exit(0 if predicted <= p95 else 1)


def _predicted_model(
    profile: str, gpu: str, model_id: str | None, lengths_from: str | None, overflow: float | None
) -> ServiceModel:
    """T(B) fitted to the scheduler model's predicted pages/s at 1, 2, 4, ... pages in flight, up to
    the ``--max-num-seqs`` ``ocrserve plan --profile PROFILE`` plans for ``model_id`` on ``gpu``
    (:mod:`ocrserve.gpu.concurrency`)."""
    settings = profile_settings(profile, model_id, [])
    try:
        plan = gpu_plan(settings, model=model_id, gpu=gpu, output_lengths=lengths_from, overflow=overflow)
    except (ModelError, GpuError, PlanError, LengthsError) as exc:
        err_console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    concurrency = plan.concurrency
    if concurrency is None or concurrency.model is None:
        err_console.print(f"[red]error:[/red] no prediction for {plan.gpu.name}: its memory bandwidth is unknown")
        raise typer.Exit(2)
    seqs = plan.vllm_args["max_num_seqs"]
    model = ServiceModel.fit(concurrency.model.throughput_curve(seqs))
    chosen = "statistical" if seqs == concurrency.candidate("statistical").seqs else "worst case"
    Console().print(
        f"predicted, not measured: {plan.model.id} on {plan.gpu.name} (profile {profile or 'none'}), "
        f"--max-num-seqs {seqs} ({chosen}); {concurrency.lengths.describe(plan.model.max_tokens)}; "
        f"{concurrency.step_time}",
        highlight=False,
    )
    return model


def _model(from_bench, a, b, max_batch) -> ServiceModel:
    if from_bench:
        fitted = json.loads(from_bench.read_text()).get("service_model")
        if not fitted:
            err_console.print(
                f"[red]error:[/red] {from_bench} has no service_model: run `ocrserve bench` with two or "
                "more --concurrency points"
            )
            raise typer.Exit(2)
        documents = tuple(tuple(d) for d in fitted["documents"].values())
        return ServiceModel(fitted["a"], fitted["b"], fitted["max_batch"], documents)
    if a is None or b is None or max_batch is None:
        err_console.print("[red]error:[/red] give --from-bench REPORT, or --a, --b and --max-batch")
        raise typer.Exit(2)
    return ServiceModel(a, b, max_batch)
