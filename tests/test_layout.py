"""Reading order on line boxes with known answers: columns, titles, receipts, rotations, skew and
vertical writing (:mod:`ocrserve.layout`)."""

from __future__ import annotations

import math

import pytest

from ocrserve.layout import arrange, reading_order
from ocrserve.pages import Line

W, H = 1000, 1400


def rect(x0: float, y0: float, x1: float, y1: float) -> list[list[float]]:
    """An axis-aligned box as four points, clockwise from top-left."""
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def lines_of(boxes: dict[str, list[list[float]]]) -> list[Line]:
    return [Line(text, box, 0.9) for text, box in boxes.items()]


def two_columns() -> dict[str, list[list[float]]]:
    """A full-width title above two columns of four lines each, lines 30 px tall every 40 px."""
    boxes = {"Title": rect(100, 50, 900, 90)}
    for i in range(4):
        y = 150 + 40 * i
        boxes[f"left{i}"] = rect(100, y, 480, y + 30)
        boxes[f"right{i}"] = rect(520, y, 900, y + 30)
    return boxes


def texts(boxes: dict[str, list[list[float]]], rotation: int = 0, size: tuple[float, float] = (W, H)) -> list[str]:
    arranged = arrange(lines_of(boxes), *size, rotation)
    return [line.text for line in arranged.lines]


def test_a_title_then_each_column_top_to_bottom():
    arranged = arrange(lines_of(two_columns()), W, H)
    assert [line.text for line in arranged.lines] == ["Title"] + [f"left{i}" for i in range(4)] + [
        f"right{i}" for i in range(4)
    ]
    assert [block["lines"] for block in arranged.blocks] == [[0], [1, 2, 3, 4], [5, 6, 7, 8]]
    assert [line.block for line in arranged.lines] == [0, 1, 1, 1, 1, 2, 2, 2, 2]
    assert arranged.blocks[1]["box"] == [100, 150, 480, 300]
    assert arranged.text.split("\n\n") == ["Title", "left0\nleft1\nleft2\nleft3", "right0\nright1\nright2\nright3"]


def test_a_receipts_price_column_is_read_across_its_rows():
    boxes = {}
    for i in range(5):
        y = 100 + 40 * i
        boxes[f"item{i}"] = rect(100, y, 500, y + 30)
        boxes[f"{i}.50"] = rect(800, y, 880, y + 30)  # 8% of the width: not a column
    assert arrange(lines_of(boxes), W, H).text == "\n".join(f"item{i} {i}.50" for i in range(5))


def test_boxes_of_one_row_are_read_left_to_right_whatever_their_order():
    boxes = {"world": rect(300, 100, 500, 130), "Hello": rect(100, 102, 280, 131), "next": rect(100, 140, 300, 170)}
    assert texts(boxes) == ["Hello", "world", "next"]


def turn(boxes: dict[str, list[list[float]]], rotation: int) -> dict[str, list[list[float]]]:
    """The boxes of a W x H page whose content was turned ``rotation`` degrees clockwise."""

    def point(x: float, y: float) -> list[float]:
        return {90: [H - y, x], 180: [W - x, H - y], 270: [y, W - x]}[rotation]

    return {text: [point(x, y) for x, y in box] for text, box in boxes.items()}


@pytest.mark.parametrize("rotation", [90, 180, 270])
def test_a_turned_page_reads_as_the_upright_one(rotation):
    size = (H, W) if rotation in (90, 270) else (W, H)
    assert texts(turn(two_columns(), rotation), rotation, size) == texts(two_columns())


def test_skew_is_read_through():
    """Two columns turned 5 degrees: without deskewing, the right column's lines sit lower than the
    left's and rows would mix."""
    angle = math.radians(5)

    def skewed(box):
        return [
            [x * math.cos(angle) - y * math.sin(angle) + 200, x * math.sin(angle) + y * math.cos(angle)] for x, y in box
        ]

    boxes = {text: skewed(box) for text, box in two_columns().items()}
    order = reading_order(list(boxes.values()), W + 400, H + 200)
    assert order.skew_deg == pytest.approx(5.0, abs=0.01)
    assert texts(boxes, size=(W + 400, H + 200)) == texts(two_columns())


def test_vertical_writing_is_read_column_by_column_right_to_left():
    boxes = {"first": rect(800, 100, 840, 600), "second": rect(700, 100, 740, 500), "third": rect(600, 100, 640, 550)}
    order = reading_order(list(boxes.values()), W, H)
    assert order.vertical
    assert texts(boxes) == ["first", "second", "third"]


def test_no_lines_and_a_bad_rotation():
    assert arrange([], W, H).text == ""
    with pytest.raises(ValueError):
        arrange(lines_of(two_columns()), W, H, rotation=45)


def test_chinese_boxes_of_one_row_join_without_spaces():
    boxes = {"我是": rect(100, 100, 300, 200), "中国人": rect(320, 100, 600, 200), "ok": rect(620, 100, 700, 200)}
    assert arrange(lines_of(boxes), W, H).text == "我是中国人 ok"


def test_a_word_boxed_twice_is_read_once():
    """rapidocr boxes black_font_color_transparent.png's line and, again, its last character."""
    boxes = {"我是中国人": rect(294, 44, 1495, 463), "人": rect(1314, 96, 1661, 397), "next": rect(300, 500, 600, 560)}
    arranged = arrange(lines_of(boxes), 2000, 600)
    assert arranged.text == "我是中国人\nnext"
    assert [line.text for line in arranged.lines] == ["我是中国人", "next"]


def test_boxes_off_the_page_are_held_to_it():
    """A VLM may write any numbers in its boxes: ordering costs the page's size, not the box's."""
    boxes = {"far": rect(0, 0, 1e12, 30), "here": rect(10, 100, 200, 130)}
    assert texts(boxes) == ["far", "here"]


def headline_over_columns() -> dict[str, list[list[float]]]:
    """A headline 10 px above two columns of eight lines (30 px tall every 40 px): too close for
    a section break, and across the gutter, so the XY-cut finds neither."""
    boxes = {"Headline": rect(100, 100, 900, 140)}
    for i in range(8):
        y = 150 + 40 * i
        boxes[f"left{i}"] = rect(100, y, 480, y + 30)
        boxes[f"right{i}"] = rect(520, y, 900, y + 30)
    return boxes


COLUMN_REGIONS = [[95, 95, 905, 145], [95, 148, 485, 470], [515, 148, 905, 470]]
COLUMNS_READ = ["Headline"] + [f"left{i}" for i in range(8)] + [f"right{i}" for i in range(8)]


def test_layout_regions_keep_columns_apart_under_a_headline_that_spans_them():
    assert texts(headline_over_columns())[:3] == ["Headline", "left0", "right0"]  # boxes alone: across
    arranged = arrange(lines_of(headline_over_columns()), W, H, regions=COLUMN_REGIONS)
    assert [line.text for line in arranged.lines] == COLUMNS_READ
    assert [len(block["lines"]) for block in arranged.blocks] == [1, 8, 8]


def test_lines_of_no_region_are_read_among_the_regions_by_the_xy_cut():
    boxes = {**headline_over_columns(), "footer": rect(450, 1300, 550, 1330)}
    regions = [COLUMN_REGIONS[1], COLUMN_REGIONS[2], [0, 0, 40, 40]]  # the headline's and the footer's missed
    assert texts_with(boxes, regions) == [*COLUMNS_READ, "footer"]


def test_a_line_in_two_regions_goes_to_the_one_holding_more_of_it_then_the_larger():
    regions = [COLUMN_REGIONS[0], [95, 148, 485, 470], [515, 148, 905, 470], [95, 148, 485, 300]]
    assert texts_with(headline_over_columns(), regions) == COLUMNS_READ  # the nested region holds nothing


def test_regions_turn_with_the_page():
    """A page turned 90 degrees clockwise: its boxes and regions turn alike (x, y) -> (H - y, x)."""
    turn = lambda x0, y0, x1, y1: [H - y1, x0, H - y0, x1]  # noqa: E731
    boxes = {text: rect(*turn(*box[0], *box[2])) for text, box in headline_over_columns().items()}
    regions = [turn(*region) for region in COLUMN_REGIONS]
    assert [line.text for line in arrange(lines_of(boxes), H, W, 90, regions).lines] == COLUMNS_READ


def texts_with(boxes: dict[str, list[list[float]]], regions: list[list[float]]) -> list[str]:
    return [line.text for line in arrange(lines_of(boxes), W, H, regions=regions).lines]
