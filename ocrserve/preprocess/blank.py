"""Blank pages: pages with no ink, answered without the engine.

A page is blank when, in every colour channel of the normalized page (the image the engine would
read), fewer than :data:`MIN_INK_PIXELS` pixels lie more than :data:`INK_DELTA` grey levels from
the channel's most common level (its background). The check reads the page's histogram (Pillow's,
in C: about 5 ms for a 1 Mpx RGB page on one core), so a blank page costs its decoding and nothing
else, where the engine would take a second or more on each: 200 blank 8 x 8 pages took 108 s of
engine time.

The thresholds err towards OCR: a page wrongly taken as blank loses its text, one wrongly taken
as inked costs one engine pass. Measured on A4 pages at 200 dpi (1654 x 2339, normalized to
840 x 1176) holding a single word in DejaVu Sans, 8 to 40 px, grey 0 to 220 on white: the faintest
words the embedded engine read ("OK", "to" at 24 px in grey 220, a contrast of 35) have 37 to 49
pixels beyond 16 levels; two black letters of 8 px ("to"), which it cannot read, still have 13.
Every page of the corpus (``../shared/corpus``) and of ``examples/*.tif`` has over 2,000 (the
fewest: ``ocrmypdf/crom.png``, one line on a 56 x 392 page). A uniform page has none, and so has
a JPEG of one (quantization moves a flat area by a level or two).
"""

from __future__ import annotations

import numpy as np
from PIL import Image

#: Grey levels (of 255) a pixel must differ from its channel's background to count as ink: above
#: JPEG quantization and paper noise on flat areas (a few levels), below the contrast of the
#: faintest text the engine reads (35 levels: grey 220 on white).
INK_DELTA = 16
#: Ink pixels (per channel, at the normalized size) a page needs not to be blank: below one 8 px
#: letter after normalization, a third of the faintest word the engine was seen to read (37).
MIN_INK_PIXELS = 12


def ink_pixels(image: Image.Image) -> int:
    """Pixels of ``image`` that differ from the background by more than :data:`INK_DELTA` levels.

    Args:
        image: the page at its normalized size, any 8-bit mode (``L``, ``RGB``, ...).

    Returns:
        The largest count over the image's channels, each counted against its most common level.
    """
    histogram = np.asarray(image.histogram(), dtype=np.int64).reshape(-1, 256)
    counts = []
    for channel in histogram:
        background = int(channel.argmax())
        near = channel[max(0, background - INK_DELTA) : background + INK_DELTA + 1].sum()
        counts.append(int(channel.sum() - near))
    return max(counts)


def is_blank(image: Image.Image) -> bool:
    """Whether ``image`` (a normalized page, 8-bit) has no ink: fewer than :data:`MIN_INK_PIXELS`
    pixels beyond :data:`INK_DELTA` levels from the background in every channel."""
    return ink_pixels(image) < MIN_INK_PIXELS
