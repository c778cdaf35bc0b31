"""Synthetic text pages, normalized as uploads are, for calibrating the admission's model of a
page's seconds in the engine (:mod:`ocrserve.servicetime`) before the first client's page.

The model prices a page by its pixels and its line units (its text lines, weighed as recognition
weighs them), so three pages tell them apart: a strip of one line (640 x 200 client pixels), a
letter-size page at 200 dpi full of lines (1700 x 2200), and the same page with its first line
alone; each resized to the pixel budget like any upload, its line units counted as an upload's
are.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from ocrserve.config import PreprocessConfig
from ocrserve.pages import Page
from ocrserve.preprocess import target_size
from ocrserve.preprocess.geometry import visual_tokens
from ocrserve.preprocess.lines import line_units

#: The calibration pages: client-pixel width and height, and lines of text (None: as many as fit,
#: one every 60 px): a one-line strip, a letter page at 200 dpi full of lines, the letter page
#: with one line.
PAGES = ((640, 200, 1), (1700, 2200, None), (1700, 2200, 1))
LINE = "Calibration page 0123456789: the quick brown fox jumps over the lazy dog."


def text_page(width: int, height: int, cfg: PreprocessConfig, lines: int | None = None) -> Page:
    """A white ``width x height`` page with ``lines`` lines of black text (None: one every 60 px
    down the page), at its normalized size."""
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for y in list(range(40, height - 40, 60))[:lines]:
        draw.text((40, y), LINE, fill="black", font_size=28)
    out_w, out_h = target_size(width, height, cfg)
    pixels = np.asarray(image.resize((out_w, out_h), Image.Resampling.LANCZOS))
    return Page(
        index=0,
        image=pixels,
        width=width,
        height=height,
        visual_tokens=visual_tokens(out_h, out_w, cfg.factor),
        line_units=line_units(pixels),
    )


def calibration_pages(cfg: PreprocessConfig) -> list[Page]:
    """The pages of :data:`PAGES` under ``cfg``'s pixel budget."""
    return [text_page(width, height, cfg, lines) for width, height, lines in PAGES]
