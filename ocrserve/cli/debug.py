"""``ocrserve debug``: one page through the whole production path in plain PyTorch, no server.

The page is decoded and normalized by the preprocessor with the profile's settings (pixel budget,
factor), then OCRed by the debug engine (:class:`~ocrserve.engines.transformers.TransformersEngine`,
the request the ``vllm`` engine would send), and every stage's time and size is printed: decode,
normalize, model load, image encoding, processor (image and prompt tokens), prefill, decoding
(new tokens, tokens/s), peak memory, then the text and how the reply ended. With ``--compare URL``
the same page also goes to a running gateway (``POST /v1/ocr``) and the two texts are shown side by
side with their character error rate: "model or serving?" in one command.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Annotated

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ocrserve.cli.common import Overrides, err_console, load_or_exit, require_extra
from ocrserve.client import OcrClient, RequestFailed
from ocrserve.config import Config
from ocrserve.errors import ProblemError
from ocrserve.evaluation import cer
from ocrserve.pages import Page
from ocrserve.preprocess import DecodeFailure, decode_pages, inspect_document

#: What each ``finish_reason`` of the debug engine means.
FINISH_REASONS = {
    "stop": "the model ended its reply",
    "length": "cut by max_new_tokens",
    "time": "cut by the wall-clock cap (page_timeout_s)",
    "repetition": "cut by the repetition guard",
}
INSTALL_HINT = "debug mode needs torch and transformers: pip install -e '.[debug]'"


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/bold red] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _preprocess(file: Path, number: int, config: Config) -> tuple[Page, dict]:
    """Decode and normalize page ``number`` (1-based) of ``file``; the page and its two stages.

    Raises:
        typer.Exit: the file is not a document the gateway takes, or has no such page (2).
    """
    cfg = config.preprocess
    t0 = time.perf_counter()
    try:
        info = inspect_document(file, cfg)
        inspect_s = time.perf_counter() - t0
        if number > info.page_count:
            raise _fail(f"{file} has {info.page_count} page(s); --page {number} is out of range")
        (decoded,) = decode_pages(file, info, [number - 1], cfg)
    except ProblemError as exc:
        raise _fail(f"{file}: {exc.detail}") from None
    if isinstance(decoded, DecodeFailure):
        raise _fail(f"{file}: {decoded.problem.detail}")
    height, width = decoded.image.shape[:2]
    stages = {
        "decode": {
            "s": round(inspect_s + decoded.preprocess_s, 4),
            "kind": info.kind,
            "pages": info.page_count,
            "source_size": [decoded.width, decoded.height],
        },
        "normalize": {
            "min_pixels": cfg.min_pixels,
            "max_pixels": cfg.max_pixels,
            "factor": cfg.factor,
            "max_side": cfg.max_side,
            "size": [width, height],
            "pixels": width * height,
        },
    }
    return decoded, stages


async def _run_engine(engine, page: Page, status) -> tuple[object, float]:
    """Start the engine (load and warm up), OCR the page, close; the result and the start's seconds."""
    t0 = time.perf_counter()
    await engine.start()
    load_s = time.perf_counter() - t0
    try:
        status.update(f"OCR of page {page.index + 1} on {engine.device}...")
        return await engine.ocr_page(page), load_s
    finally:
        await engine.close()


async def _gateway(url: str, file: Path, number: int, api_key: str | None) -> dict:
    async with OcrClient(url, api_key=api_key, attempts=3) as client:
        return await client.ocr(file, fmt="json", pages=str(number))


def _check_file(file: Path) -> None:
    """Exit 2 unless ``file`` is a file."""
    if file.is_dir():
        raise _fail(f"{file} is a folder; give one image or PDF")
    if not file.is_file():
        raise _fail(f"no such file: {file}")


def _reachable(url: str) -> str:
    """``url`` with ``http://`` where it has no scheme, once its ``/healthz`` answers (before the
    local run, which may take minutes); else exit 2."""
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise _fail(f"--compare {url}: not an http:// or https:// URL")
    try:
        httpx.get(url.rstrip("/") + "/healthz", timeout=10).raise_for_status()
    except httpx.HTTPError as exc:
        raise _fail(f"--compare {url}: the gateway does not answer /healthz: {type(exc).__name__}: {exc}") from None
    return url


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _budget(pixels: int) -> str:
    side = round(pixels**0.5)
    return f"{side}²" if side * side == pixels else f"{pixels:,}"


def _stage_table(report: dict) -> Table:
    s = report["stages"]
    dec, norm, load, enc, proc, pre, gen, mem = (
        s[k] for k in ("decode", "normalize", "load", "encode", "processor", "prefill", "decode_tokens", "peak_memory")
    )
    table = Table(title=f"ocrserve debug: {report['file']}, page {report['page']} of {dec['pages']}")
    table.add_column("stage", style="bold")
    table.add_column("time", justify="right")
    table.add_column("sizes")
    table.add_row(
        "decode", f"{dec['s']:.3f} s", f"{dec['kind']}, page {report['page']}: {_size(dec['source_size'])} px"
    )
    side = f", max side {norm['max_side']}" if norm["max_side"] else ""
    table.add_row(
        "normalize",
        "(in decode)",
        f"budget {_budget(norm['min_pixels'])}..{_budget(norm['max_pixels'])} px, factor {norm['factor']}{side} "
        f"-> {_size(norm['size'])} ({norm['pixels']:,} px)",
    )
    table.add_row(
        "load + warm-up",
        f"{load['s']:.3f} s",
        f"{load['class']}, {load['parameters']:,} params, {load['device']} {load['dtype']}",
    )
    table.add_row("encode", f"{enc['s']:.3f} s", f"{enc['format']} data URI")
    table.add_row(
        "processor",
        f"{proc['s']:.3f} s",
        f"{proc['image_tokens']:,} image tokens, {proc['prompt_tokens']:,} prompt tokens",
    )
    table.add_row("prefill", f"{pre['s']:.3f} s", "to the first new token")
    table.add_row(
        "decode", f"{gen['s']:.3f} s", f"{gen['new_tokens']:,} new tokens, {gen['tokens_per_s']:,.1f} tokens/s"
    )
    if report["retried"]:
        changed = ", ".join(f"{k}={v}" for k, v in report["retry_sampling"].items())
        table.add_row("first try", f"{s['first_try']['s']:.3f} s", f"cut by max_new_tokens; retried with {changed}")
    table.add_row("peak memory", "", f"{_mib(mem['bytes'])} ({mem['kind']})")
    return table


def _size(wh: list[int]) -> str:
    return f"{wh[0]}x{wh[1]}"


def _print_report(console: Console, report: dict) -> None:
    console.print(_stage_table(report))
    reason = report["finish_reason"]
    retried = "; the reply of the retry (see 'first try')" if report["retried"] else ""
    console.print(f"finish_reason: [bold]{reason}[/bold] ({FINISH_REASONS.get(reason, '?')}{retried})", highlight=False)
    compare = report.get("compare")
    if compare is None:
        console.rule("text")
        console.print(report["text"] or "[dim](empty)[/dim]", markup=bool(not report["text"]), highlight=False)
        return
    side = Table(title="model or serving?", show_lines=True, expand=True)
    side.add_column(f"debug: {report['model']} ({report['stages']['load']['device']})", ratio=1)
    side.add_column(f"gateway: {compare['url']} ({compare['model']})", ratio=1)
    side.add_row(report["text"] or "(empty)", compare["text"] or "(empty)")
    error = compare["error"]
    remote = (
        f"error: {error.get('title')}: {error.get('detail')}"
        if error
        else f"finish_reason: {compare['finish_reason'] or '(not reported by its engine)'}"
    )
    side.add_row(f"finish_reason: {reason}", remote)
    console.print(side, markup=False, highlight=False)
    if not compare["same_model"]:
        console.print(
            f"[yellow]note:[/yellow] the gateway serves {compare['model']}, not {report['stages']['load']['model']}: "
            "the texts may differ by model, not by serving",
            highlight=False,
        )
    if compare["cer"] is None:
        console.print("CER: undefined, the debug engine's text (the reference) is empty", highlight=False)
        return
    console.print(
        f"CER of the gateway's text against the debug engine's: [bold]{compare['cer']:.2%}[/bold]"
        + (" (identical)" if compare["text"] == report["text"] else ""),
        highlight=False,
    )


def debug(
    file: Annotated[Path, typer.Argument(metavar="FILE", help="An image or PDF.")],
    profile: Annotated[
        str, typer.Option(help="Profile of the transformers engine: preprocessing, model, device, guards.")
    ] = "debug",
    model: Annotated[
        str | None, typer.Option(help="Registry id (in the Hugging Face cache) or local model folder.")
    ] = None,
    page: Annotated[int, typer.Option(min=1, help="Page number, 1-based.")] = 1,
    overrides: Overrides = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    compare: Annotated[
        str | None,
        typer.Option(metavar="URL", help="Also OCR the page on a running gateway and compare the texts (CER)."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar="OCRSERVE_API_KEY", help="API key of the --compare gateway, if it wants one.")
    ] = None,
) -> None:
    """Run one page through the production path in plain PyTorch, without a server, and show each stage.

    Decode and normalize with the profile's preprocessing, then the debug engine (transformers):
    the table shows each stage's time and sizes, then the text and how the reply ended. Needs the
    debug extra (pip install -e '.\\[debug]'). Exit status: 0, 1 when the page or the --compare
    gateway failed, 2 for a bad file, page, profile or model.

    Examples:

        ocrserve debug scan.png --model /models/HunyuanOCR

        ocrserve debug report.pdf --page 3 --json

        ocrserve debug scan.png --set engine.transformers.max_new_tokens=512

        ocrserve debug scan.png --compare http://ocr.internal:8000      # model or serving?
    """
    require_extra("debug", "ocrserve debug")
    _check_file(file)
    config = load_or_exit(profile, [*(overrides or []), *([f"engine.model={model}"] if model else [])])
    if config.engine.kind != "transformers":
        raise _fail(
            f"engine.kind is {config.engine.kind} (profile {profile!r}{' with --set' if overrides else ''}); "
            "ocrserve debug needs the transformers engine"
        )
    compare = _reachable(compare) if compare else None
    try:
        from ocrserve.engines.base import PageError
        from ocrserve.engines.transformers import TransformersEngine
    except ImportError as exc:
        raise _fail(f"{INSTALL_HINT} ({exc})") from None
    try:
        engine = TransformersEngine(config)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    decoded, stages = _preprocess(file, page, config)
    source = config.engine.model
    with err_console.status(f"loading {source} on {engine.device} ({engine.dtype})...") as status:
        try:
            result, load_s = asyncio.run(_run_engine(engine, decoded, status))
        except ValueError as exc:
            raise _fail(str(exc)) from None
        except PageError as exc:
            raise _fail(str(exc), 1) from None
    kind, peak = engine.peak_memory()
    gen, timings = result.generation, result.timings
    info = engine.describe()
    report = {
        "file": str(file),
        "page": page,
        "model": source,
        "profile": profile,
        "stages": stages
        | {
            "load": {
                "s": round(load_s, 4),
                "model": engine.model,
                "class": info["class"],
                "parameters": info["parameters"],
                "device": info["device"],
                "dtype": info["dtype"],
            },
            "encode": {"s": timings["encode_s"], "format": config.engine.vllm.image_format},
            "processor": {
                "s": timings["processor_s"],
                "image_tokens": gen["image_tokens"],
                "prompt_tokens": gen["prompt_tokens"],
            },
            "prefill": {"s": timings["prefill_s"]},
            "decode_tokens": {
                "s": timings["decode_s"],
                "new_tokens": gen["new_tokens"],
                "tokens_per_s": gen["tokens_per_s"],
                "max_new_tokens": info["max_new_tokens"],
            },
            "peak_memory": {"kind": kind, "bytes": peak},
        }
        | ({"first_try": {"s": timings["first_try_s"]}} if gen["retried"] else {}),
        "finish_reason": gen["finish_reason"],
        "truncated": gen["truncated"],
        "retried": gen["retried"],
        "retry_sampling": dict(engine.spec.retry_sampling) if gen["retried"] else None,
        "text": result.text,
    }
    failed = None
    if compare:
        with err_console.status(f"OCR of page {page} on {compare}..."):
            try:
                body = asyncio.run(_gateway(compare, file, page, api_key))
            except (RequestFailed, httpx.HTTPError) as exc:
                failed = f"--compare {compare}: {type(exc).__name__}: {exc}"
        if failed is None:
            remote = body["pages"][0]
            report["compare"] = {
                "url": compare,
                "model": body.get("model"),
                "same_model": body.get("model") == engine.model,
                "text": remote.get("text", ""),
                "finish_reason": (remote.get("generation") or {}).get("finish_reason"),
                "error": remote.get("error"),
                "cer": round(cer(remote.get("text", ""), result.text), 4) if result.text else None,
            }
            if remote.get("error"):
                failed = f"--compare {compare}: the gateway failed page {page}: {remote['error'].get('detail')}"
    if json_:
        typer.echo(json.dumps(report, ensure_ascii=False))
    else:
        _print_report(Console(), report)
    if failed:
        raise _fail(failed, 1)
