"""Synthetic text pages, normalized as uploads are, for calibrating the admission's model of a
page's seconds in the engine (:mod:`ocrserve.servicetime`) before the first client's page.

Two pages of different cost are enough for the model to learn how time grows with it: a strip
of one line (640 x 200 client pixels) and a letter-size page at 200 dpi full of lines (1700 x 2200),
both resized to the pixel budget like any upload.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from ocrserve.config import PreprocessConfig
from ocrserve.pages import Page
from ocrserve.preprocess import target_size
from ocrserve.preprocess.geometry import visual_tokens

#: Client-pixel sizes of the calibration pages: a one-line strip and a letter page at 200 dpi.
SIZES = ((640, 200), (1700, 2200))
LINE = "Calibration page 0123456789: the quick brown fox jumps over the lazy dog."


def text_page(width: int, height: int, cfg: PreprocessConfig) -> Page:
    """A white ``width x height`` page with lines of black text every 60 px, at its normalized size."""
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for y in range(40, height - 40, 60):
        draw.text((40, y), LINE, fill="black", font_size=28)
    out_w, out_h = target_size(width, height, cfg)
    image = image.resize((out_w, out_h), Image.Resampling.LANCZOS)
    return Page(
        index=0,
        image=np.asarray(image),
        width=width,
        height=height,
        visual_tokens=visual_tokens(out_h, out_w, cfg.factor),
    )


def calibration_pages(cfg: PreprocessConfig) -> list[Page]:
    """The pages of :data:`SIZES` under ``cfg``'s pixel budget."""
    return [text_page(width, height, cfg) for width, height in SIZES]
