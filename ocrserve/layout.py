"""Reading order: a page's text lines grouped into rows, blocks and columns, ordered as a person reads.

It works on line boxes alone (quadrilaterals in page pixels), so it serves every engine that
returns them: the embedded engine's detections and a VLM's layout boxes alike.

1. **Frame.** Boxes are turned into the page's upright frame: ``rotation`` is how far the text is
   turned clockwise on the page (0, 90, 180 or 270 degrees; the engine detects it), and the skew is
   the median angle of the long lines' long edges, up to :data:`MAX_SKEW_DEG`. Vertical writing
   (columns of upright characters, read right to left) is read as horizontal text turned 90
   degrees. Nothing is resampled: boxes stay in the client's pixels.
2. **Recursive XY-cut** (Nagy and Seth, "Hierarchical representation of optically scanned
   documents", ICPR 1984) on the upright boxes. A region splits, in this order of preference: into
   two bands at its widest horizontal gap of at least :data:`SECTION_GAP` line heights (a title
   above two columns); into columns at gutters of at least :data:`COLUMN_GAP` line heights that
   few boxes cross (:func:`_columns`) when every column is column-like (at least
   :data:`MIN_COLUMN_SHARE` of the region's width, lines :data:`MIN_COLUMN_ASPECT` times wider
   than tall: a receipt's price column is not a column, its rows are read across); into two
   bands at its widest gap of at least :data:`BAND_GAP` line heights (and of
   :data:`PARAGRAPH_GAP` times the gap between lines, where lines have gaps). A region that
   splits no more is a block. Columns are read left to right, bands top to bottom.
3. **Rows.** Within a block, boxes whose vertical centres lie within :data:`ROW_TOLERANCE` of a
   line height form a row, read left to right; rows top to bottom.

**Regions.** Where a layout model located the page's regions (paragraphs, titles, captions,
figures: :func:`reading_order`'s ``regions``), each line goes to the region that holds at least
:data:`REGION_SHARE` of its box, and the XY-cut of step 2 first orders the regions (each the box
of its lines) and the lines of no region among them, with the page's line height; then the lines
of each region are ordered by steps 2 and 3 alone. A region never straddles a gutter, so a
headline, picture or caption across the columns no longer hides it; what the model leaves
ambiguous (regions side by side, lines outside every region) is read by the XY-cut as before.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ocrserve.pages import Line

#: The largest skew corrected, degrees; a larger median angle is taken as no skew (tables of
#: slanted labels, a photo): the issue asks for up to about 15 degrees.
MAX_SKEW_DEG = 15.0
#: A vertical gap at least this many line heights wide may separate two columns.
COLUMN_GAP = 0.3
#: Share of a region's boxes that may cross a gutter (lines a detector merged across it).
MAX_CROSSING = 0.03
#: A column spans at least this share of its region's width.
MIN_COLUMN_SHARE = 0.2
#: A column's median line is at least this many times wider than tall.
MIN_COLUMN_ASPECT = 4.0
#: A horizontal gap at least this many line heights tall separates two bands (blocks).
BAND_GAP = 0.3
#: A gap between paragraphs is at least this many times the gap between their lines.
PARAGRAPH_GAP = 1.8
#: A horizontal gap this tall is a section break, cut before columns are looked for: a title
#: above two columns that does not span their gutter is still read first.
SECTION_GAP = 1.5
#: Boxes whose vertical centres differ by less than this share of their line height share a row.
ROW_TOLERANCE = 0.5
#: Share of a box's width within its row neighbour's above which, holding its text too, it is a
#: second reading of the same words.
DUPLICATE_OVERLAP = 0.5
#: A box this many times taller than wide is a vertical line (rapidocr's crop rule uses 1.5).
TALL = 1.5
#: Share of a line's box inside a region above which the line belongs to it (the larger share
#: wins; between regions that hold it alike, the larger region).
REGION_SHARE = 0.5


@dataclass(frozen=True)
class Rect:
    """A line's axis-aligned box in the upright frame; ``index``: the line's position in the input.
    A region's box (``index`` -1) holds its ``lines``."""

    index: int
    x0: float
    y0: float
    x1: float
    y1: float
    lines: tuple[Rect, ...] = ()

    @property
    def height(self) -> float:
        """Height in upright pixels."""
        return self.y1 - self.y0

    @property
    def cy(self) -> float:
        """Vertical centre in upright pixels."""
        return (self.y0 + self.y1) / 2


@dataclass(frozen=True)
class Order:
    """A page's reading order.

    Attributes:
        rows: each row the input indices of its boxes, left to right; rows in reading order.
        blocks: each block the indices of its rows (into ``rows``), blocks in reading order.
        skew_deg: the skew corrected, degrees (counter-clockwise positive in image coordinates).
        vertical: True where the text is written in vertical lines.
    """

    rows: list[list[int]]
    blocks: list[list[int]]
    skew_deg: float
    vertical: bool


def reading_order(
    boxes: Sequence[Sequence[Sequence[float]]],
    width: float,
    height: float,
    rotation: int = 0,
    texts: Sequence[str] | None = None,
    regions: Sequence[Sequence[float]] = (),
) -> Order:
    """The reading order of ``boxes`` (each four ``[x, y]`` points, page pixels) on a page of
    ``width`` x ``height`` pixels whose text is turned ``rotation`` degrees clockwise (module
    docstring). With the boxes' ``texts``, a box read twice is left out: one that lies at least
    :data:`DUPLICATE_OVERLAP` within its row neighbour's width and whose text the neighbour's holds
    (a detector that boxed a word and the line around it). ``regions``: the page's layout regions,
    each ``[x0, y0, x1, y1]`` in page pixels (module docstring, **Regions**).

    Raises:
        ValueError: a ``rotation`` other than 0, 90, 180 or 270.
    """
    if not len(boxes):
        return Order([], [], 0.0, False)
    points = np.asarray(boxes, dtype=np.float64).reshape(-1, 4, 2)
    points = np.clip(np.nan_to_num(points), 0, [width, height])  # a model's box may lie off the page
    points = upright(points, width, height, rotation)
    vertical = _vertical(points)
    skew = _skew(_turned(points, vertical))
    rects = _rects(_rotate(_turned(points, vertical), -skew))
    line = statistics.median(r.height for r in rects) or 1.0
    if len(regions):
        corners = np.asarray(regions, dtype=np.float64).reshape(-1, 4)[:, [0, 1, 2, 1, 2, 3, 0, 3]].reshape(-1, 4, 2)
        corners = upright(np.clip(np.nan_to_num(corners), 0, [width, height]), width, height, rotation)
        blocks_of = _in_regions(rects, _rects(_rotate(_turned(corners, vertical), -skew)), line)
    else:
        blocks_of = _cut(rects, line)
    rows, blocks = [], []
    for block in blocks_of:
        block_rows = [_once(row, rects, texts) for row in _rows(block, line)] if texts else _rows(block, line)
        blocks.append(list(range(len(rows), len(rows) + len(block_rows))))
        rows += block_rows
    return Order(rows, blocks, round(skew, 2), vertical)


@dataclass(frozen=True)
class Arranged:
    """Lines put in reading order (:func:`arrange`).

    Attributes:
        lines: the lines in reading order, each with its ``block``.
        text: rows' lines joined by spaces, rows by newlines, blocks by blank lines.
        blocks: each block's ``box`` (``[x0, y0, x1, y1]``, page pixels) and ``lines`` (indices into ``lines``).
        skew_deg: the skew read through, degrees.
    """

    lines: list[Line]
    text: str
    blocks: list[dict]
    skew_deg: float


def arrange(
    lines: Sequence[Line], width: float, height: float, rotation: int = 0, regions: Sequence[Sequence[float]] = ()
) -> Arranged:
    """``lines`` (boxes in page pixels of a ``width`` x ``height`` page, text turned ``rotation``
    degrees clockwise) in reading order, with their blocks and the page's text (module docstring);
    ``regions``: the page's layout regions, ``[x0, y0, x1, y1]`` page pixels each (:func:`reading_order`).

    Raises:
        ValueError: a ``rotation`` other than 0, 90, 180 or 270.
    """
    order = reading_order([line.box for line in lines], width, height, rotation, [line.text for line in lines], regions)
    ordered: list[Line] = []
    blocks, texts = [], []
    for number, block in enumerate(order.blocks):
        first = len(ordered)
        rows = [[lines[i] for i in order.rows[r]] for r in block]
        ordered += [Line(line.text, line.box, line.score, number) for row in rows for line in row]
        corners = np.asarray([line.box for row in rows for line in row], dtype=np.float64).reshape(-1, 2)
        box = [*corners.min(axis=0).round(1).tolist(), *corners.max(axis=0).round(1).tolist()]
        blocks.append({"box": box, "lines": list(range(first, len(ordered)))})
        texts.append("\n".join(_joined([line.text for line in row]) for row in rows))
    return Arranged(ordered, "\n\n".join(texts), blocks, order.skew_deg)


def block_order(boxes: Sequence[Sequence[Sequence[float]]], width: float, height: float) -> list[int]:
    """The indices of ``boxes`` (blocks a VLM located, four ``[x, y]`` points each, page pixels)
    in reading order: :func:`reading_order` with each box as a line."""
    order = reading_order(boxes, width, height)
    return [i for row in order.rows for i in row]


def _joined(texts: list[str]) -> str:
    """A row's texts joined by spaces, except between two characters of scripts written without
    them (Chinese, Japanese: :func:`_unspaced`)."""
    joined = texts[0]
    for text in texts[1:]:
        joined += ("" if _unspaced(joined[-1]) and _unspaced(text[0]) else " ") + text
    return joined


def _unspaced(char: str) -> bool:
    """Whether ``char`` is a CJK ideograph, kana or CJK punctuation (Unicode blocks 2E80-9FFF,
    F900-FAFF, FF00-FFEF): scripts that do not separate words by spaces."""
    code = ord(char)
    return 0x2E80 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF or 0xFF00 <= code <= 0xFFEF


def upright(points: np.ndarray, width: float, height: float, rotation: int) -> np.ndarray:
    """``points`` (``(..., 2)`` x, y on a ``width`` x ``height`` page) in the frame where text
    turned ``rotation`` degrees clockwise stands upright: the page turned back counter-clockwise.

    Raises:
        ValueError: a ``rotation`` other than 0, 90, 180 or 270.
    """
    x, y = points[..., 0], points[..., 1]
    turned = {
        0: (x, y),
        90: (y, width - x),
        180: (width - x, height - y),
        270: (height - y, x),
    }
    if rotation not in turned:
        raise ValueError(f"rotation must be 0, 90, 180 or 270, got {rotation}")
    return np.stack(turned[rotation], axis=-1)


def edge_lengths(points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each ``(n, 4, 2)`` quadrilateral's first two edges' lengths: ``(p0 p1, p1 p2)``."""
    return (
        np.linalg.norm(points[:, 1] - points[:, 0], axis=-1),
        np.linalg.norm(points[:, 2] - points[:, 1], axis=-1),
    )


def _turned(points: np.ndarray, vertical: bool) -> np.ndarray:
    """``points`` as rows: vertical writing's columns (read right to left) turned into rows."""
    return np.stack([points[..., 1], -points[..., 0]], axis=-1) if vertical else points


def _rects(points: np.ndarray) -> list[Rect]:
    """Each ``(n, 4, 2)`` quadrilateral's axis-aligned box, indexed by its position."""
    return [
        Rect(i, float(p[:, 0].min()), float(p[:, 1].min()), float(p[:, 0].max()), float(p[:, 1].max()))
        for i, p in enumerate(points)
    ]


def _in_regions(rects: list[Rect], regions: list[Rect], line: float) -> list[list[Rect]]:
    """The blocks of a page whose lines ``rects`` a layout model grouped into ``regions``, in
    reading order (module docstring, **Regions**)."""
    boxes = np.asarray([[r.x0, r.y0, r.x1, r.y1] for r in rects])
    areas = np.asarray([[r.x0, r.y0, r.x1, r.y1] for r in regions])
    across = np.minimum(boxes[:, None, 2], areas[None, :, 2]) - np.maximum(boxes[:, None, 0], areas[None, :, 0])
    down = np.minimum(boxes[:, None, 3], areas[None, :, 3]) - np.maximum(boxes[:, None, 1], areas[None, :, 1])
    share = np.clip(across, 0, None) * np.clip(down, 0, None)
    share /= np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1e-6)[:, None]
    size = (areas[:, 2] - areas[:, 0]) * (areas[:, 3] - areas[:, 1])
    best = np.lexsort((-np.broadcast_to(size, share.shape), -share.round(3)), axis=1)[:, 0]
    members: dict[int, list[Rect]] = {}
    units = []
    for rect, region, held in zip(rects, best, share[np.arange(len(rects)), best], strict=True):
        if held >= REGION_SHARE:
            members.setdefault(int(region), []).append(rect)
        else:
            units.append(rect)
    if not members:
        return _cut(rects, line)
    for lines in members.values():
        box = (min(r.x0 for r in lines), min(r.y0 for r in lines), max(r.x1 for r in lines), max(r.y1 for r in lines))
        units.append(Rect(-1, *box, tuple(lines)))
    blocks: list[list[Rect]] = []
    for group in _cut(units, line, regions=True):
        loose: list[Rect] = []  # lines of no region, read together until the next region
        for unit in sorted(group, key=lambda u: (u.y0, u.x0)):
            if unit.lines:
                blocks += _cut(loose, line) if loose else []
                blocks += _cut(list(unit.lines), line)
                loose = []
            else:
                loose.append(unit)
        blocks += _cut(loose, line) if loose else []
    return blocks


def _vertical(points: np.ndarray) -> bool:
    """True where most of the text (by box area) is in tall boxes: vertical writing."""
    w = points[..., 0].max(axis=1) - points[..., 0].min(axis=1)
    h = points[..., 1].max(axis=1) - points[..., 1].min(axis=1)
    tall = h > TALL * w
    return bool((w * h)[tall].sum() > (w * h)[~tall].sum())


def _skew(points: np.ndarray) -> float:
    """The median angle of long boxes' long edges in degrees, 0 when none or above :data:`MAX_SKEW_DEG`."""
    across, down = edge_lengths(points)
    edge = np.where((across >= down)[:, None], points[:, 1] - points[:, 0], points[:, 2] - points[:, 1])
    long = np.maximum(across, down) >= 3 * np.minimum(across, down)
    if not long.any():
        return 0.0
    angles = np.degrees(np.arctan2(edge[long, 1], edge[long, 0]))
    angles = (angles + 90) % 180 - 90  # an edge and its reverse are the same direction
    skew = float(np.median(angles))
    return skew if abs(skew) <= MAX_SKEW_DEG else 0.0


def _rotate(points: np.ndarray, degrees: float) -> np.ndarray:
    """``points`` turned ``degrees`` (image coordinates, y down: positive turns clockwise) about the origin."""
    if not degrees:
        return points
    a = math.radians(degrees)
    x, y = points[..., 0], points[..., 1]
    return np.stack([x * math.cos(a) - y * math.sin(a), x * math.sin(a) + y * math.cos(a)], axis=-1)


def _cut(rects: list[Rect], line: float, regions: bool = False) -> list[list[Rect]]:
    """The blocks of a region in reading order (module docstring, step 2); ``regions``: ``rects``
    are layout regions and lines of none (:func:`_bands`)."""
    cuts = (
        lambda: _bands(rects, line, SECTION_GAP, regions),
        lambda: _columns(rects, line),
        lambda: _bands(rects, line, BAND_GAP, regions),
    )
    for cut in cuts:  # each tried only where the one before did not split the region
        parts = cut()
        if len(parts) > 1:
            return [block for part in parts for block in _cut(part, line, regions)]
    return [rects]


def _gaps(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The uncovered stretches between the union of ``spans``, in order."""
    gaps, reach = [], None
    for start, end in sorted(spans):
        if reach is not None and start > reach:
            gaps.append((reach, start))
        reach = end if reach is None else max(reach, end)
    return gaps


def _split(rects: list[Rect], cuts: list[float], key) -> list[list[Rect]]:
    """``rects`` in groups between ``cuts`` (ascending) by ``key(rect)``."""
    groups: list[list[Rect]] = [[] for _ in range(len(cuts) + 1)]
    for rect in rects:
        groups[sum(key(rect) > cut for cut in cuts)].append(rect)
    return groups


def _columns(rects: list[Rect], line: float) -> list[list[Rect]]:
    """The region's columns left to right, or the region alone: a gutter is a vertical stretch at
    least :data:`COLUMN_GAP` line heights wide that at most :data:`MAX_CROSSING` of the region's
    boxes cross (a detector merges lines across a narrow gutter now and then); a box across it
    joins the column left of it. A column that is not column-like (:func:`_column_like`) joins
    its neighbour across the narrower gutter."""
    left, right = min(r.x0 for r in rects), max(r.x1 for r in rects)
    gutters = _gutters(rects, left, right, int(MAX_CROSSING * len(rects)), COLUMN_GAP * line)
    if not gutters:
        return [rects]
    widths = [g[1] - g[0] for g in gutters]
    groups = _split(rects, [g[0] for g in gutters], lambda r: r.x0)
    while len(groups) > 1:
        narrow = [i for i, g in enumerate(groups) if not _column_like(g, right - left)]
        if not narrow:
            break
        i = narrow[0]
        j = i - 1 if i == len(groups) - 1 or (i > 0 and widths[i - 1] <= widths[i]) else i + 1
        low = min(i, j)
        groups[low : low + 2] = [groups[low] + groups[low + 1]]
        del widths[low]
    return groups


def _gutters(rects: list[Rect], left: float, right: float, crossing: int, width: float) -> list[tuple[float, float]]:
    """Stretches of x between ``left`` and ``right``, at least ``width`` wide, that at most
    ``crossing`` boxes cover, and that have boxes on both sides; in order."""
    edges = np.arange(math.floor(left), math.ceil(right) + 1)
    covered = np.zeros(len(edges), dtype=np.int32)
    for r in rects:
        covered[int(r.x0 - edges[0]) : int(math.ceil(r.x1 - edges[0])) + 1] += 1
    open_ = covered <= crossing
    gutters, start = [], None
    for x, free in zip(edges, open_, strict=True):
        if free and start is None:
            start = x
        elif not free and start is not None:
            if x - start >= width and start > left:
                gutters.append((float(start), float(x)))
            start = None
    return gutters


def _column_like(rects: list[Rect], region: float) -> bool:
    """Whether ``rects`` read as a column of text in a region ``region`` wide: they span at least
    :data:`MIN_COLUMN_SHARE` of it, and their median line is :data:`MIN_COLUMN_ASPECT` times wider
    than tall (a receipt's amounts, a table's figures are not: their rows are read across)."""
    extent = max(r.x1 for r in rects) - min(r.x0 for r in rects)
    lines = [line for r in rects for line in (r.lines or (r,))]  # a region's lines, not its box
    aspect = statistics.median((r.x1 - r.x0) / max(r.height, 1e-6) for r in lines)
    return extent >= MIN_COLUMN_SHARE * region and aspect >= MIN_COLUMN_ASPECT


def _bands(rects: list[Rect], line: float, least: float, regions: bool = False) -> list[list[Rect]]:
    """The region cut in two at its widest horizontal gap of at least ``least`` line heights and
    :data:`PARAGRAPH_GAP` times the gap between its lines where most of them have one (tight boxes
    of a PDF's text layer; a detector's padded boxes touch; not between ``regions``), top first;
    or the region alone."""
    gaps = _gaps([(r.y0, r.y1) for r in rects])
    rows = len(_rows(rects, line))
    lined = rows > 2 and len(gaps) >= rows / 2 and not regions  # a gap between regions is a gap between blocks
    spacing = statistics.median(b - a for a, b in gaps) if lined else 0.0
    wide = [g for g in gaps if g[1] - g[0] >= max(least * line, PARAGRAPH_GAP * spacing)]
    if not wide:
        return [rects]
    widest = max(wide, key=lambda g: g[1] - g[0])
    return _split(rects, [(widest[0] + widest[1]) / 2], lambda r: r.cy)


def _once(row: list[int], rects: list[Rect], texts: Sequence[str]) -> list[int]:
    """A row's boxes (left to right) without those read twice (:func:`reading_order`)."""
    kept: list[int] = []
    for i in row:
        previous = rects[kept[-1]] if kept else None
        current = rects[i]
        if previous is not None:
            overlap = min(previous.x1, current.x1) - max(previous.x0, current.x0)
            narrower, wider = sorted((kept[-1], i), key=lambda k: rects[k].x1 - rects[k].x0)
            inside = overlap >= DUPLICATE_OVERLAP * (rects[narrower].x1 - rects[narrower].x0)
            if inside and texts[narrower].strip() in texts[wider]:
                kept[-1] = wider
                continue
        kept.append(i)
    return kept


def _rows(rects: list[Rect], line: float) -> list[list[int]]:
    """A block's rows top to bottom, each its boxes' indices left to right (module docstring, step 3)."""
    rows: list[list[Rect]] = []
    for rect in sorted(rects, key=lambda r: r.cy):
        row = rows[-1] if rows else None
        if row is not None and abs(rect.cy - statistics.fmean(r.cy for r in row)) < ROW_TOLERANCE * line:
            row.append(rect)
        else:
            rows.append([rect])
    return [[r.index for r in sorted(row, key=lambda r: r.x0)] for row in rows]
