"""Talking to an OCR vision-language model: the request recipe and the reading of its reply.

A VLM engine (vLLM over HTTP, or PyTorch in debug mode) sends one page as an image plus the
model's task prompt, with the model card's sampling, and gets text back. This module builds that
request from the model registry (:mod:`ocrserve.models`) and turns the reply into a
:class:`~ocrserve.pages.PageResult`'s text and lines:

* the clean-up the model card applies (``ModelSpec.postprocess``): HunyuanOCR's
  ``clean_repeated_substrings``, olmOCR's YAML front matter;
* a markdown fence around the whole reply is removed (models wrap markdown answers in one);
* boxes where the model writes them: DeepSeek-OCR's grounding markup and dots.ocr's layout JSON.
  Every other line gets the full-page box: a VLM reads the page, it does not locate lines.

VLMs report no per-line confidence; lines carry ``score`` 1.0.
"""

from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ocrserve.layout import block_order
from ocrserve.models import ModelSpec
from ocrserve.models.spec import TASK_MARKUP
from ocrserve.pages import Line, Page, PageResult

if TYPE_CHECKING:
    from ocrserve.config import RepeatGuardConfig

#: PNG zlib level: 1 is ~5x faster than the default 6 on page scans and ~10-20% larger.
PNG_COMPRESS_LEVEL = 1
#: HunyuanOCR's clean-up leaves replies shorter than this alone (output_utils.py: ``if n < 8000``).
REPEAT_MIN_CHARS = 8000
#: ...and cuts a tail unit that repeats at least this many times down to one copy.
REPEAT_MIN_COUNT = 10
#: DeepSeek-OCR grounding boxes are normalized to 0..999 (DeepSeek-OCR repo,
#: ``DeepSeek-OCR-vllm/run_dpsk_ocr_image.py`` ``draw_bounding_boxes``: ``x / 999 * width``).
DEEPSEEK_BOX_SCALE = 999.0

_FENCE = re.compile(r"\A\s*```[A-Za-z]*[ \t]*\n(.*?)\n?```\s*\Z", re.S)
_FRONT_MATTER = re.compile(r"\A\s*---\s*\n.*?\n---\s*(?:\n|\Z)", re.S)
_GROUNDING = re.compile(r"<\|ref\|>(.*?)<\|/ref\|><\|det\|>(.*?)<\|/det\|>", re.S)
_BOX = re.compile(r"\[\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*,\s*(-?[\d.]+)\s*\]")


def image_data_uri(image: np.ndarray, fmt: str = "png", quality: int = 95) -> str:
    """An ``(h, w, 3)`` uint8 RGB page as a ``data:`` URI (OpenAI ``image_url``), PNG or JPEG.

    CPU-bound (tens of ms for a 4 MP page): call it off the event loop.
    """
    buffer = io.BytesIO()
    picture = Image.fromarray(image)
    if fmt == "jpeg":
        picture.save(buffer, "JPEG", quality=quality, subsampling=0)
        mime = "image/jpeg"
    else:
        picture.save(buffer, "PNG", compress_level=PNG_COMPRESS_LEVEL)
        mime = "image/png"
    return f"data:{mime};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def chat_messages(spec: ModelSpec, task: str, image_url: str) -> list[dict]:
    """OpenAI chat messages for one page: the model's system turn (if any), then one user turn with
    the image and the task prompt in the order the model card uses.

    Raises:
        KeyError: ``task`` is not one of the model's prompts (``text``, ``markdown``, ``table``).
    """
    image = {"type": "image_url", "image_url": {"url": image_url}}
    text = {"type": "text", "text": spec.prompt_prefix + spec.prompts[task]}
    messages = [] if spec.system_prompt is None else [{"role": "system", "content": spec.system_prompt}]
    messages.append({"role": "user", "content": [image, text] if spec.image_first else [text, image]})
    return messages


def page_recipe(spec: ModelSpec, task: str, image_url: str) -> dict:
    """What every VLM engine sends for one page: ``messages`` (:func:`chat_messages`) and the model
    recipe's sampling (greedy or near-greedy, ``max_tokens`` always set, the card's repetition
    guards) in vLLM's spelling. The ``vllm`` engine posts it, the ``transformers`` engine maps the
    sampling onto ``generate`` (``ocrserve.engines.transformers.generate_kwargs``).

    Raises:
        KeyError: ``task`` is not one of the model's prompts.
    """
    return {"messages": chat_messages(spec, task, image_url), **spec.sampling}


def completion_request(spec: ModelSpec, task: str, image_url: str, *, model: str, priority: int | None) -> dict:
    """The body of ``POST /v1/chat/completions`` for one page: :func:`page_recipe` for ``model``.

    Parameters OpenAI lacks (``top_k``, ``repetition_penalty``, ``vllm_xargs``) ride along at the
    top level, as vLLM accepts them. ``priority`` is sent only when not ``None`` (vLLM rejects it
    unless run with ``--scheduling-policy priority``).
    """
    body = {"model": model, **page_recipe(spec, task, image_url)}
    if priority is not None:
        body["priority"] = priority
    return body


def strip_fence(text: str) -> str:
    """The inside of a markdown code fence wrapping the whole reply (```` ```markdown ... ``` ````)."""
    match = _FENCE.match(text)
    return match.group(1) if match else text


def clean_repeated_substrings(text: str) -> str:
    """Cut a degenerate tail: a unit repeated ``REPEAT_MIN_COUNT``+ times at the end becomes one copy.

    HunyuanOCR's own rule (``inference/utils/output_utils.py``): replies under
    ``REPEAT_MIN_CHARS`` characters are left alone; units of 2 .. n/10 characters are tried,
    shortest first.
    """
    n = len(text)
    if n < REPEAT_MIN_CHARS:
        return text
    found = tail_repeat(text, REPEAT_MIN_COUNT, n // 10)
    if found is None:
        return text
    length, count = found
    return text[: n - length * (count - 1)]


def tail_repeat(text: str, min_count: int, max_length: int) -> tuple[int, int] | None:
    """The shortest unit of 2 .. ``max_length`` characters that ends ``text`` and repeats there back
    to back at least ``min_count`` times, as ``(length, count)``; ``None`` when there is none.

    The search of HunyuanOCR's ``clean_repeated_substrings`` (``inference/utils/output_utils.py``),
    shared by the clean-up and the debug engine's repetition guard.
    """
    n = len(text)
    for length in range(2, max_length + 1):
        unit = text[-length:]
        count, i = 0, n - length
        while i >= 0 and text[i : i + length] == unit:
            count, i = count + 1, i - length
        if count >= min_count:
            return length, count
    return None


class RepeatWatch:
    """HunyuanOCR's batch-client guard against a looping reply, applied while the reply grows: once
    it is ``start_chars`` long, and then every ``every_chars``, its last ``window_chars`` are
    searched for a tail unit repeated ``min_count`` times back to back (:func:`tail_repeat`);
    defaults 4,000 / 1,000 / 8,000 / 8 (issue 11, quoting HunyuanOCR's batch client).

    The one rule both VLM engines stop a page by (``engine.repeat_guard``): the ``vllm`` engine
    on the streamed reply, the ``transformers`` engine in a ``StoppingCriteria``.
    """

    def __init__(self, cfg: RepeatGuardConfig):
        self.cfg = cfg
        self.next_check = cfg.start_chars
        self.fired = False

    def check(self, text: str) -> bool:
        """Whether ``text`` (the whole reply so far) now ends in a loop; stays true once it fired."""
        if not self.fired and len(text) >= self.next_check:
            self.next_check = len(text) + self.cfg.every_chars
            window = text[-self.cfg.window_chars :]
            self.fired = tail_repeat(window, self.cfg.min_count, len(window) // self.cfg.min_count) is not None
        return self.fired


def retry_sampling(spec: ModelSpec, sampling: Mapping[str, object]) -> dict | None:
    """The sampling of the one retry of a page whose reply ``max_tokens`` cut (``finish_reason``
    ``length``): ``sampling`` with the model card's stronger repetition guard
    (``ModelSpec.retry_sampling``, e.g. olmOCR's next temperature); ``None`` where the registry
    has none (the page stays truncated)."""
    if not spec.retry_sampling:
        return None
    return {**sampling, **spec.retry_sampling}


def strip_yaml_front_matter(text: str) -> str:
    """olmOCR replies are markdown under a YAML front matter block (``---`` ... ``---``); keep the markdown."""
    return _FRONT_MATTER.sub("", text, count=1)


CLEANERS: dict[str, Callable[[str], str]] = {
    "": lambda text: text,
    "clean_repeated_substrings": clean_repeated_substrings,
    "strip_yaml_front_matter": strip_yaml_front_matter,
}
"""``ModelSpec.postprocess`` name -> the clean-up it names."""


def page_box(page: Page) -> list[list[float]]:
    """The whole page as a box, in client pixels."""
    w, h = float(page.width), float(page.height)
    return [[0.0, 0.0], [w, 0.0], [w, h], [0.0, h]]


def _rect(x1: float, y1: float, x2: float, y2: float, sx: float, sy: float) -> list[list[float]]:
    x1, x2, y1, y2 = round(x1 * sx, 1), round(x2 * sx, 1), round(y1 * sy, 1), round(y2 * sy, 1)
    return [[x1, y1], [x2, y1], [x2, y2], [x1, y2]]


def _text_lines(text: str, box: list[list[float]]) -> list[Line]:
    return [Line(text=line.strip(), box=box, score=1.0) for line in text.splitlines() if line.strip()]


#: A block a VLM located: its text and its box (client pixels).
Cell = tuple[str, list[list[float]]]


def grounded_cells(text: str, page: Page) -> list[Cell] | None:
    """DeepSeek-OCR grounding markup: ``<|ref|>kind<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>`` then
    the block's text up to the next marker. Boxes are 0..999 of the page. ``None`` without markup."""
    markers = list(_GROUNDING.finditer(text))
    if not markers:
        return None
    sx, sy = page.width / DEEPSEEK_BOX_SCALE, page.height / DEEPSEEK_BOX_SCALE
    cells = []
    for marker, following in zip(markers, markers[1:] + [None], strict=True):
        body = text[marker.end() : following.start() if following else len(text)].strip()
        boxes = [_rect(*map(float, b.groups()), sx, sy) for b in _BOX.finditer(marker.group(2))]
        if body:
            cells.append((body, boxes[0] if boxes else page_box(page)))
    return cells


def layout_cells(text: str, page: Page) -> list[Cell] | None:
    """dots.ocr layout JSON: ``[{"bbox": [x1, y1, x2, y2], "category": ..., "text": ...}, ...]`` with
    boxes in pixels of the image the model saw (the normalized page; dots.ocr
    ``utils/layout_utils.py`` ``post_process_cells`` scales them the same way). ``None`` if not JSON."""
    try:
        cells = json.loads(text)
    except ValueError:
        return None
    if not isinstance(cells, list) or not all(isinstance(c, dict) and "bbox" in c for c in cells):
        return None
    sx, sy = page.scale
    bodies = [(str(cell.get("text") or "").strip(), cell["bbox"]) for cell in cells]
    return [(body, _rect(*map(float, bbox), sx, sy)) for body, bbox in bodies if body and len(bbox) == 4]


BOX_READERS: dict[str, Callable[[str, Page], list[Cell] | None]] = {
    "deepseek_vl_v2": grounded_cells,
    "dots_ocr": layout_cells,
}
"""``ModelSpec.architecture`` -> the reader of the located blocks that model family writes."""


def read_reply(spec: ModelSpec, reply: str, page: Page) -> tuple[str, list[Line], list[dict]]:
    """The page's text, lines and blocks from a model's reply (see the module docstring).

    Returns:
        ``(text, lines, blocks)``: lines are the text's non-empty lines, each with its box in client
        pixels. Blocks a model located are put in reading order (:func:`ocrserve.layout.block_order`)
        and separated by blank lines; each line carries its block's index, and ``blocks`` their boxes.
    """
    text = strip_fence(CLEANERS[spec.postprocess](reply).strip())
    reader = BOX_READERS.get(spec.architecture)
    cells = reader(text, page) if reader else None
    if cells is None:
        return text, _text_lines(text, page_box(page)), []
    cells = [cells[i] for i in block_order([box for _, box in cells], page.width, page.height)]
    lines, blocks = [], []
    for number, (body, box) in enumerate(cells):
        first = len(lines)
        lines += [Line(line.text, line.box, line.score, number) for line in _text_lines(body, box)]
        blocks.append({"box": [*box[0], *box[2]], "lines": list(range(first, len(lines)))})
    return "\n\n".join(body for body, _ in cells), lines, blocks


def reply_result(spec: ModelSpec, task: str, reply: str, page: Page, timings: dict, generation: dict) -> PageResult:
    """The :class:`PageResult` of ``page`` from a model's ``reply`` (:func:`read_reply`) to the prompt
    of ``task`` (its ``markup``: :data:`~ocrserve.models.spec.TASK_MARKUP`), with the engine's
    ``timings`` (seconds) and ``generation`` report (``finish_reason`` and the like)."""
    text, lines, blocks = read_reply(spec, reply, page)
    return PageResult(
        index=page.index,
        width=page.width,
        height=page.height,
        text=text,
        lines=lines,
        timings=timings,
        generation=generation,
        blocks=blocks,
        markup=TASK_MARKUP[task],
    )
