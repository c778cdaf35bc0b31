"""The preprocessor on real and generated documents: modes, orientation, containers, limits."""

from __future__ import annotations

import ast
import asyncio
import io
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image

from ocrserve.config import PreprocessConfig
from ocrserve.errors import BadRequest, PayloadTooLarge, UnsupportedMedia
from ocrserve.preprocess import (
    DecodeFailure,
    Preprocessor,
    decode_pages,
    geometry,
    inspect_document,
    parse_page_ranges,
    target_size,
)
from ocrserve.preprocess.geometry import smart_resize, visual_tokens
from ocrserve.preprocess.pool import WARNINGS_PER_MINUTE, DecodePool
from ocrserve.work import EngineClass
from tests import samples
from tests.conftest import DATA

CFG = PreprocessConfig(min_pixels=3136, max_pixels=4_000_000, factor=32, max_side=2000)


def decode_all(data, cfg=CFG):
    info = inspect_document(data, cfg)
    return decode_pages(data, info, range(info.page_count), cfg)


def test_smart_resize_rounds_to_factor_within_budget():
    # 480 x 640: 480/28 = 17.14 -> 17*28 = 476; 640/28 = 22.86 -> 23*28 = 644; 476*644 = 306,544 in budget
    assert smart_resize(480, 640, 28, 3136, 1_003_520) == (476, 644)
    # 3508 x 2480 (A4 at 300 dpi) over max_pixels 1,003,520 (28*28*1280):
    # beta = sqrt(3508*2480 / 1003520) = sqrt(8.6694) = 2.94438
    # h = floor(3508 / 2.94438 / 28) * 28 = floor(42.551) * 28 = 1176
    # w = floor(2480 / 2.94438 / 28) * 28 = floor(30.082) * 28 = 840
    assert smart_resize(3508, 2480, 28, 3136, 1_003_520) == (1176, 840)
    # 20 x 30 under min_pixels 3136: beta = sqrt(3136/600) = 2.2862
    # h = ceil(20 * 2.2862 / 28) * 28 = ceil(1.633) * 28 = 56; w = ceil(30 * 2.2862 / 28) * 28 = ceil(2.449) * 28 = 84
    assert smart_resize(20, 30, 28, 3136, 1_003_520) == (56, 84)


def test_extreme_aspect_ratio_refused():
    with pytest.raises(PayloadTooLarge, match="aspect ratio 250:1 exceeds 200:1"):
        target_size(2500, 10, CFG)


def test_target_size_caps_longer_side_then_applies_factor():
    # 4000 x 2864 -> max_side 2000 -> 2000 x 1432 -> multiples of 32: 2000/32=62.5 -> 62*32=1984 (round half even),
    # 1432/32 = 44.75 -> 45*32 = 1440; 1984*1440 = 2,856,960 <= 4,000,000
    assert target_size(4000, 2864, CFG) == (1984, 1440)


def test_visual_tokens_one_per_factor_block():
    # (height, width, factor): one token per factor x factor block
    assert visual_tokens(1440, 1984, 32) == 45 * 62
    assert visual_tokens(1176, 840, 28) == 42 * 30
    # HunyuanOCR's parameters: a newline token per row, begin/end per image: 64 * (64 + 1) + 2
    assert visual_tokens(2048, 2048, 32, row_tokens=1, image_tokens=2) == 4162


def test_geometry_is_the_lowest_layer():
    # ocrserve.models and the planner import the geometry; it imports nothing from ocrserve
    tree = ast.parse(Path(geometry.__file__).read_text(encoding="utf-8"))
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported if name.split(".")[0] == "ocrserve"}


def test_preprocessor_page_cost_is_the_geometry_formula():
    image = Image.new("RGB", (2480, 3508), "white")
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    [page] = decode_all(buffer.getvalue())
    h, w = page.image.shape[:2]
    assert page.visual_tokens == visual_tokens(h, w, CFG.factor) == (h // CFG.factor) * (w // CFG.factor)


def test_page_ranges():
    assert parse_page_ranges("1-3,5", 6) == [0, 1, 2, 4]
    assert parse_page_ranges(None, 3) == [0, 1, 2]
    assert parse_page_ranges(" 2 ", 3) == [1]
    assert parse_page_ranges("1 - 2, 2", 3) == [0, 1]
    for bad in ("0", "3-1", "a", "1-9", "1,,2", "-1", "\u0661", "1-2-3", "+1"):
        with pytest.raises(BadRequest):
            parse_page_ranges(bad, 4)


def test_one_bit_tiff_to_rgb_with_original_size():
    (page,) = decode_all((DATA / "phototest.tif").read_bytes())
    assert (page.width, page.height) == (640, 480)
    assert page.image.shape == (480, 640, 3) and page.image.dtype == np.uint8
    assert page.scale == (1.0, 1.0)


def test_exif_orientation_applied():
    (page,) = decode_all(samples.exif_rotated_jpeg())
    assert (page.width, page.height) == (640, 480)  # stored 480 x 640, displayed landscape
    # phototest's text starts top-left: the top-left quarter holds dark pixels, the bottom-right corner is white
    assert page.image[:120, :320].min() < 100
    assert page.image[-20:, -20:].min() > 200


def test_cmyk_jpeg_keeps_white_paper_white():
    (page,) = decode_all(samples.cmyk_jpeg())
    assert page.image[-20:, -20:].mean() > 240  # an inverted-CMYK mistake would make it black
    assert page.image.min() < 60  # and the text stays dark


def test_alpha_flattened_on_white():
    (page,) = decode_all((DATA / "black_font_color_transparent.png").read_bytes())
    # black text on a transparent background: dropping alpha gives black on black
    assert np.median(page.image) == 255
    assert page.image.min() < 50


def test_sixteen_bit_gray_scaled_to_eight():
    gray16 = Image.fromarray(np.tile(np.linspace(0, 65535, 256), (64, 1)).astype(np.uint16))
    assert gray16.mode == "I;16"
    (page,) = decode_all(samples.encode(gray16, "PNG"))
    assert page.image.min() == 0 and page.image.max() == 255


def test_palette_png_to_rgb():
    (page,) = decode_all(samples.encode(samples.phototest().convert("P"), "PNG"))
    assert page.image.shape == (480, 640, 3)


def test_multipage_tiff_every_page():
    pages = decode_all((DATA / "testTIFF_multipage.tif").read_bytes())
    assert [p.index for p in pages] == [0, 1]


def test_pyramidal_tiff_skips_reduced_resolution_copies():
    info = inspect_document(samples.pyramidal_tiff(), CFG)
    assert info.page_count == 1 and info.frames == (0,)


def test_pdf_rotate_honoured_and_rendered_at_budget():
    (page,) = decode_all(samples.rotated_pdf())
    # 480 x 640 pt image page, /Rotate 90 -> displayed 640 x 480 pt -> at 200 dpi 1778 x 1333 px
    assert (page.width, page.height) == (1778, 1333)
    h, w = page.image.shape[:2]
    assert w > h and w % 32 == 0 and h % 32 == 0
    assert page.image[: h // 4, : w // 2].min() < 100  # text upright: top-left holds ink


def test_pdf_render_respects_pixel_budget():
    cfg = PreprocessConfig(min_pixels=3136, max_pixels=200_000, factor=28)
    (page,) = decode_all(samples.rotated_pdf(), cfg)
    h, w = page.image.shape[:2]
    assert h * w <= 200_000 and h % 28 == 0 and w % 28 == 0


def test_gif_first_frame_only():
    frames = [samples.phototest(), samples.phototest().transpose(Image.Transpose.FLIP_TOP_BOTTOM)]
    data = samples.encode(frames[0], "GIF", save_all=True, append_images=frames[1:])
    assert inspect_document(data, CFG).page_count == 1


@pytest.mark.parametrize("fmt", ["WEBP", "BMP", "PNG"])
def test_other_formats(fmt):
    (page,) = decode_all(samples.encode(samples.phototest(), fmt))
    assert (page.width, page.height) == (640, 480)


def test_jpeg_draft_decodes_large_page_small():
    big = samples.phototest().resize((6400, 4800))
    cfg = PreprocessConfig(min_pixels=3136, max_pixels=1_000_000, factor=28)
    (page,) = decode_all(samples.encode(big, "JPEG", quality=90), cfg)
    assert (page.width, page.height) == (6400, 4800)
    assert page.image.shape[0] * page.image.shape[1] <= 1_000_000


def test_limits_and_bad_files():
    with pytest.raises(UnsupportedMedia, match="empty"):
        inspect_document(b"", CFG)
    with pytest.raises(UnsupportedMedia, match="not a supported document"):
        inspect_document(b"hello, this is text\n", CFG)
    with pytest.raises(PayloadTooLarge, match="max_document_pages=10000"):
        inspect_document(samples.blank_pdf(10_001), CFG)
    with pytest.raises(PayloadTooLarge, match="300 pages selected .*max_pages=200 per request"):
        inspect_document(samples.blank_pdf(300), CFG).select(None, CFG)
    (failure,) = decode_all(samples.png_header_only(40000, 40000))
    assert isinstance(failure, DecodeFailure) and failure.problem.status == 413
    assert "max_page_pixels" in failure.problem.detail
    (failure,) = decode_all(samples.truncated_jpeg())
    assert isinstance(failure, DecodeFailure) and failure.problem.status == 415


async def test_pool_recovers_after_a_worker_dies():
    preprocessor = Preprocessor(CFG)
    try:
        await preprocessor.warm_up()
        processes = [psutil.Process(pid) for pid in preprocessor.worker_pids()]  # both pools
        for process in processes:
            process.kill()  # killed while idle, from outside
        psutil.wait_procs(processes, timeout=30)  # reaped by their pool
        data = (DATA / "phototest.tif").read_bytes()
        info = await preprocessor.inspect(data)
        pages = [p async for chunk in preprocessor.pages(data, info, [0]) for p in chunk]
        assert pages[0].image.shape == (480, 640, 3)
    finally:
        preprocessor.close()


@pytest.mark.parametrize("scheduling", ["idle", "nice"])
async def test_background_decoding_processes_yield_the_cores(scheduling):
    """The background pool's processes run under SCHED_IDLE (``preprocess.background_scheduling``
    idle) or at nice +10 (nice, ``background_nice``); the interactive pool's keep the gateway's
    policy and nice value."""
    cfg = PreprocessConfig(workers=1, background_workers=1, background_scheduling=scheduling)
    preprocessor = Preprocessor(cfg)
    policy, nice = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)
    try:
        await preprocessor.warm_up()
        interactive, background = preprocessor.worker_pids()
        seen = [(os.sched_getscheduler(pid), os.getpriority(os.PRIO_PROCESS, pid)) for pid in (interactive, background)]
    finally:
        preprocessor.close()
    low = (os.SCHED_IDLE, nice) if scheduling == "idle" else (policy, min(nice + 10, 19))
    assert seen == [(policy, nice), low]


@pytest.mark.parametrize("scheduling", ["idle", "nice"])
async def test_a_background_requests_line_count_runs_at_nice_10_not_sched_idle(scheduling, monkeypatch):
    """Counting a background request's line units (``preprocess.background_nice``, whatever
    ``background_scheduling`` says) outranks the engine's bulk pages at SCHED_IDLE but yields to
    interactive work; an interactive request's count keeps the gateway's policy and nice value."""
    seen: list[tuple[int, int]] = []

    def units_each(previews):
        seen.append((os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        return [None for _ in previews]

    monkeypatch.setattr("ocrserve.preprocess.lines.units_each", units_each)
    preprocessor = Preprocessor(PreprocessConfig(workers=1, background_workers=1, background_scheduling=scheduling))
    policy, nice = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        assert await preprocessor.line_units([None], EngineClass.INTERACTIVE) == [None]
        assert await preprocessor.line_units([None], EngineClass.BACKGROUND) == [None]
    finally:
        preprocessor.close()
    assert seen == [(policy, nice), (policy, min(nice + 10, 19))]


async def test_a_free_decoding_process_goes_to_the_most_urgent_task():
    """One process busy: tasks queued at priorities 10, 0 and 5 run 0, 5, 10 (then first come)."""
    pool = DecodePool(PreprocessConfig(workers=1))
    try:
        await pool.warm_up()
        order: list[int] = []

        async def task(priority: int) -> None:
            await pool.run(time.sleep, 0.05, priority=priority)
            order.append(priority)

        busy = asyncio.create_task(pool.run(time.sleep, 0.5))
        await asyncio.sleep(0.1)  # the process has taken the busy task
        queued = []
        for priority in (10, 0, 5):
            queued.append(asyncio.create_task(task(priority)))
            await asyncio.sleep(0.01)
        await asyncio.gather(busy, *queued)
        assert order == [0, 5, 10]
    finally:
        pool.close()


def test_decoding_processes_die_with_the_gateway():
    """``kill -9`` of the process that owns the pool takes its decoding processes with it (they
    were left behind as orphans; issue 10)."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER], cwd=Path(__file__).parents[1], stdout=subprocess.PIPE, text=True
    )
    try:
        workers = [psutil.Process(int(pid)) for pid in owner.stdout.readline().split()]
        assert workers and all(w.is_running() for w in workers)
    finally:
        owner.kill()
        owner.wait(30)
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not [w for w in alive if w.status() != psutil.STATUS_ZOMBIE]


OWNER = """
import asyncio, time
from ocrserve.config import PreprocessConfig
from ocrserve.preprocess import Preprocessor
async def main():
    pre = Preprocessor(PreprocessConfig(workers=2))
    await pre.warm_up()
    print(*pre.worker_pids(), flush=True)
    time.sleep(600)
asyncio.run(main())
"""


PAGE = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >>"
CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"


@pytest.mark.parametrize(
    "pdf",
    [
        samples.raw_pdf(CATALOG, b"<< /Type /Pages /Kids [2 0 R] /Count 1 >>"),  # /Kids loops to itself
        samples.raw_pdf(CATALOG, b"<< /Type /Pages /Kids [] /Count 3 >>"),  # a page tree with no leaf
    ],
    ids=["kids-loop", "no-leaf"],
)
def test_broken_pdf_page_trees_are_415_not_500(pdf):
    """pdfium's ``PdfiumError`` escaped ``inspect_document`` and became a 500 (issue 10)."""
    with pytest.raises(UnsupportedMedia, match="cannot be decoded: PdfiumError"):
        inspect_document(pdf, CFG)


def png_bytes() -> bytes:
    return samples.encode(samples.phototest(), "PNG")


def test_truncated_and_corrupted_pngs_are_415_not_500():
    """A PNG cut in half, and one whose IDAT is garbage: the page fails with 415 (before, ``getexif``
    decoded the image outside the decoder's ``try`` and the error became a 500)."""
    data = png_bytes()
    idat = data.index(b"IDAT") - 4
    length = int.from_bytes(data[idat : idat + 4], "big")
    garbage = data[:idat] + samples.png_chunk(b"IDAT", b"\x78\x9c" + b"\xff" * length) + data[idat + 12 + length :]
    for broken, detail in (
        (data[: len(data) // 2], "page 1: image data ends early"),
        (garbage, "page 1 cannot be decoded"),
    ):
        (page,) = decode_all(broken)
        assert isinstance(page, DecodeFailure) and page.problem.status == 415
        assert detail in page.problem.detail


def test_a_png_with_pdf_in_a_text_chunk_is_read_as_the_png():
    """Sniffing goes by the signature at offset 0: ``%PDF-`` inside a PNG's text chunk does not
    make it a PDF."""
    data = png_bytes()
    text = samples.png_chunk(b"tEXt", b"Comment\x00%PDF-1.7 not a pdf")
    data = data[:33] + text + data[33:]  # after the signature and IHDR
    info = inspect_document(data, CFG)
    assert (info.kind, info.page_count) == ("image", 1)


def test_page_counting_stops_past_the_limit():
    """A multi-page TIFF above ``max_document_pages`` is refused after counting
    ``max_document_pages + 1`` frames, not all of them (a 2 MB TIFF can declare 20,000)."""
    page = Image.new("1", (8, 8), 1)
    tiff = samples.encode(page, "TIFF", save_all=True, append_images=[page] * 59)  # 60 frames
    cfg = CFG.model_copy(update={"max_document_pages": 5})
    with pytest.raises(PayloadTooLarge, match="the document has 6 pages or more; .*max_document_pages=5"):
        inspect_document(tiff, cfg)


def exif_flood_png(tags: int = 2000) -> bytes:
    """A 16 x 16 PNG whose eXIf block holds ``tags`` entries that each point past the file: Pillow
    warns once per tag ("Tag data larger than file")."""
    entries = b"".join(struct.pack("<HHII", 0x9000 + i, 7, 1_000_000, 0xFFFFFF00) for i in range(tags))
    tiff = struct.pack("<2sHI", b"II", 42, 8) + struct.pack("<H", tags) + entries + b"\0\0\0\0"
    png = samples.encode(Image.new("L", (16, 16), 255), "PNG")
    return png[:33] + samples.png_chunk(b"eXIf", tiff) + png[33:]


async def test_decoder_warnings_are_rate_limited_in_the_log(capfd):
    """2,000 warnings from one page reach the log as at most WARNINGS_PER_MINUTE lines (each line
    below 300 bytes), not as 4,000 lines of Pillow's own output (issue 10)."""
    data = exif_flood_png()
    preprocessor = Preprocessor(CFG.model_copy(update={"workers": 1}))
    try:
        await preprocessor.warm_up()
        capfd.readouterr()
        info = await preprocessor.inspect(data)
        (page,) = [p async for chunk in preprocessor.pages(data, info, [0]) for p in chunk]
    finally:
        preprocessor.close()
    assert not isinstance(page, DecodeFailure)  # the warnings cost nothing but log lines
    logged = capfd.readouterr().err
    assert logged.count("Skipping tag") <= WARNINGS_PER_MINUTE and len(logged) < 300 * WARNINGS_PER_MINUTE
