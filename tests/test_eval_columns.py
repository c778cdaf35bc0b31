"""scripts/eval_columns.py: both reading orders scored from one engine pass, and the generated pages
it reads (:mod:`ocrserve.bench.columns`)."""

from __future__ import annotations

import asyncio
import json

import numpy as np

import ocrserve.engines.onnx as onnx_engine
from ocrserve.bench.columns import KINDS, generate
from ocrserve.pages import Page, PageResult
from tests.scripts import load_script
from tests.test_layout import COLUMN_REGIONS, COLUMNS_READ, H, W, headline_over_columns, lines_of

eval_columns = load_script("eval_columns")


class RegionsEngine:
    """Orders its page's lines as the ONNX engine does with the layout model on: through the
    module's ``arrange`` (which ``--compare`` records), with regions."""

    async def ocr_page(self, page: Page) -> PageResult:
        arranged = onnx_engine.arrange(lines_of(headline_over_columns()), W, H, 0, COLUMN_REGIONS)
        return PageResult(index=0, width=W, height=H, text=arranged.text, lines=arranged.lines, timings={})


def test_compare_orders_the_engines_own_lines_with_and_without_regions(monkeypatch):
    recorder = eval_columns.Recorder()
    monkeypatch.setattr(onnx_engine, "arrange", recorder)
    page = Page(index=0, image=np.zeros((H, W, 3), np.uint8), width=W, height=H, visual_tokens=0)
    texts, _ = asyncio.run(eval_columns.read(RegionsEngine(), page, recorder))
    assert texts["regions"].split() == COLUMNS_READ
    assert texts["boxes"].split()[:3] == ["Headline", "left0", "right0"]  # the XY-cut alone reads across
    assert sorted(texts["boxes"].split()) == sorted(COLUMNS_READ)  # the same lines


def test_rows_of_runs_of_parts_make_one_table(tmp_path, capsys):
    rows = [
        {"kind": "two_columns", "name": "a", "pages": 1, "det_s": 1.0, "rec_s": 2.0, "boxes": 0.2, "regions": 0.1},
        {"kind": "skewed", "name": "b", "pages": 1, "det_s": 3.0, "rec_s": 2.0, "boxes": 0.0, "regions": 0.3},
    ]
    for number, row in enumerate(rows):
        (tmp_path / f"{number}.json").write_text(json.dumps([row]))
    assert eval_columns.main(["--rows", str(tmp_path / "0.json"), str(tmp_path / "1.json")]) == 0
    table = {line.split()[1]: line.split()[2:] for line in capsys.readouterr().out.splitlines() if "│" in line}
    assert table["all"][:4] == ["│", "2", "│", "2"] and "0.100" in table["all"] and "0.200" in table["all"]
    assert "2000" in table["all"]  # det ms a page: (1000 + 3000) / 2


def test_a_generated_page_is_the_same_for_the_same_seed_and_another_for_another():
    page = generate(KINDS[0], 1, 0)
    again = generate(KINDS[0], 1, 0)
    assert page.name == "two_columns-1-0" and page.text == again.text and page.image.tobytes() == again.image.tobytes()
    assert generate(KINDS[0], 2, 0).text != page.text
