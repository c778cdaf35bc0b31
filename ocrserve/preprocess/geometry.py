"""Page geometry of the vision encoders ocrserve feeds: the resize rule and the visual-token count.

Pure arithmetic on pixel sizes, shared by the preprocessor (which resizes pages and estimates each
page's cost) and the model registry / memory planner (which bound the cost of the largest page).
It imports nothing from ocrserve (importing it still runs ``ocrserve.preprocess``'s own imports).

Two families:

* **grid** (Qwen2-VL and its descendants: Qwen2.5-VL, Qwen3-VL, PaddleOCR-VL, dots.ocr, olmOCR,
  HunyuanOCR): :func:`smart_resize` rounds both sides to multiples of ``factor = patch x merge``
  and one visual token covers one ``factor x factor`` block; some models add tokens per row
  (HunyuanOCR: a newline token) and per image (HunyuanOCR: begin/end), see :func:`visual_tokens`.
* **tiles** (DeepSeek-OCR Gundam mode): a fixed global view plus a grid of local tiles, see
  :func:`tile_tokens`.

All sizes are pixels, ``(height, width)`` in that order; results are tokens.
"""

from __future__ import annotations

import math

#: A side so large that :func:`smart_resize` brings it down to ``max_pixels``: a square page at the budget.
_HUGE_SIDE = 100_000


def smart_resize(height: float, width: float, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Resize ``(height, width)`` px the way Qwen2-VL-style processors do (and ocrserve's preprocessor).

    Both sides become multiples of ``factor`` (px), the area lands in ``[min_pixels, max_pixels]``
    and the aspect ratio is kept as closely as possible. Source: ``smart_resize`` in transformers'
    ``image_processing_qwen2_vl.py`` and vLLM's ``hunyuan_vl_image.py`` (identical arithmetic).

    Returns:
        ``(resized_height, resized_width)`` in pixels.
    """
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def visual_tokens(height: int, width: int, factor: int, *, row_tokens: int = 0, image_tokens: int = 0) -> int:
    """Visual tokens a grid encoder spends on an image already resized to ``height x width`` px.

    ``(h // factor) * (w // factor + row_tokens) + image_tokens``: one token per
    ``factor x factor`` block (``factor`` = patch x merge, e.g. 14-px patches merged 2x2 = 28; Qwen2-VL
    paper, arXiv:2409.12191, section 2.1), plus ``row_tokens`` per row of blocks and
    ``image_tokens`` per image. Qwen2-VL family: ``row_tokens = image_tokens = 0`` (vLLM
    ``qwen2_vl.py``: ``grid_h * grid_w / merge^2``). HunyuanOCR: ``row_tokens = 1`` (a newline per
    row), ``image_tokens = 2`` (begin/end) (vLLM ``hunyuan_vision.py`` ``_get_vision_info``).

    Args:
        height, width: the resized image, px (multiples of ``factor``).
        factor: side of the pixel block one token covers, px.
        row_tokens: extra tokens per row of blocks.
        image_tokens: extra tokens per image.
    """
    return (height // factor) * (width // factor + row_tokens) + image_tokens


def max_visual_tokens(
    factor: int,
    min_pixels: int,
    max_pixels: int,
    *,
    row_tokens: int = 0,
    image_tokens: int = 0,
    profile_image: tuple[int, int] | None = None,
) -> int:
    """The most visual tokens one page can cost under the pixel budget ``[min_pixels, max_pixels]``.

    Without per-row tokens the count only depends on the area, and :func:`smart_resize` never
    exceeds ``max_pixels``: ``max_pixels // factor**2 + image_tokens`` bounds every aspect ratio.
    With per-row tokens the count grows with the rows, so the bound is the larger of a square page
    at ``max_pixels`` and ``profile_image`` (``(height, width)`` px, the image vLLM itself profiles
    with at start-up, e.g. HunyuanOCR's 512 x 8192 px), both resized by :func:`smart_resize`; the
    planned batch-token floor is then never below vLLM's own.
    """
    if not row_tokens:
        return max_pixels // (factor * factor) + image_tokens
    sizes = [(_HUGE_SIDE, _HUGE_SIDE)] + ([tuple(profile_image)] if profile_image else [])
    return max(
        visual_tokens(
            *smart_resize(h, w, factor, min_pixels, max_pixels),
            factor,
            row_tokens=row_tokens,
            image_tokens=image_tokens,
        )
        for h, w in sizes
    )


def tilings(min_crops: int, max_crops: int) -> list[tuple[int, int]]:
    """``(cols, rows)`` tile grids DeepSeek-OCR may pick, fewest tiles first (vLLM ``calculate_aspect_ratios``)."""
    return sorted(
        {
            (i, j)
            for n in range(min_crops, max_crops + 1)
            for i in range(1, n + 1)
            for j in range(1, n + 1)
            if min_crops <= i * j <= max_crops
        },
        key=lambda r: r[0] * r[1],
    )


def closest_tiling(aspect: float, min_crops: int, max_crops: int) -> tuple[int, int]:
    """The ``(cols, rows)`` grid whose ``cols / rows`` is closest to ``aspect`` (width / height)."""
    best, best_diff = (1, 1), float("inf")
    for cols, rows in tilings(min_crops, max_crops):
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
    return best


def global_view_tokens(base_queries: int) -> int:
    """Tokens of DeepSeek-OCR's global view: ``(q_base + 1) * q_base + 1`` (a newline per row, one separator)."""
    return (base_queries + 1) * base_queries + 1


def local_tiles_tokens(cols: int, rows: int, tile_queries: int) -> int:
    """Tokens of a ``cols x rows`` grid of local tiles: ``(q * cols + 1) * (q * rows)``."""
    return (tile_queries * cols + 1) * (tile_queries * rows)


def tile_tokens(
    height: int, width: int, *, base_queries: int, tile_queries: int, tile_size: int, min_crops: int, max_crops: int
) -> int:
    """Visual tokens DeepSeek-OCR (Gundam mode) spends on a ``height x width`` px page.

    vLLM ``processors/deepseek_ocr.py`` ``tokenize_with_images``: the global 1024 px view costs
    :func:`global_view_tokens` (``q_base = 1024/16/4 = 16``: 273); when the page exceeds
    ``tile_size`` px on either side, the ``(cols, rows)`` grid closest to its aspect ratio with
    ``min_crops <= cols * rows <= max_crops`` adds :func:`local_tiles_tokens`
    (``q = 640/16/4 = 10``).
    """
    tokens = global_view_tokens(base_queries)
    if height <= tile_size and width <= tile_size:
        return tokens
    cols, rows = closest_tiling(width / height, min_crops, max_crops)
    return tokens + local_tiles_tokens(cols, rows, tile_queries)


def max_tile_tokens(*, base_queries: int, tile_queries: int, min_crops: int, max_crops: int) -> int:
    """The most tokens :func:`tile_tokens` can give: the global view plus the worst grid (1 x 6: 660)."""
    worst = max(local_tiles_tokens(c, r, tile_queries) for c, r in tilings(min_crops, max_crops))
    return global_view_tokens(base_queries) + worst


def worst_tiling(*, tile_queries: int, min_crops: int, max_crops: int) -> tuple[int, int]:
    """The ``(cols, rows)`` grid with the most local-tile tokens."""
    return max(tilings(min_crops, max_crops), key=lambda cr: local_tiles_tokens(*cr, tile_queries))
