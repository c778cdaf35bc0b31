"""The unit of work: a normalized page going in, its lines of text coming out."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class Page:
    """One page, decoded and normalized to the pixel budget, ready for an engine.

    Attributes:
        index: 0-based page number within its document.
        image: ``(height, width, 3)`` uint8 RGB array at the normalized size; both sides are
            multiples of the preprocessor's ``factor``.
        width, height: the page's size in the client's pixels (after EXIF orientation; for PDFs
            at ``preprocess.pdf_dpi``). Engine boxes are mapped back to these.
        visual_tokens: the estimate ``(h / factor) * (w / factor)`` of a VLM's visual tokens for
            ``image`` (Qwen2-VL: one token per 28x28 block after the 2x2 merge).
        preprocess_s: seconds spent decoding and resizing this page.
        orientation: whether the engine detects the page's orientation (``preprocess.orientation``).
        text_layer: a PDF page's result read from its own text layer
            (:mod:`ocrserve.preprocess.textlayer`): the page needs no OCR; None otherwise.
        blank: the page has no ink (:mod:`ocrserve.preprocess.blank`): it needs no OCR.
        line_units: the text lines on ``image``, weighed as recognition weighs them
            (:mod:`ocrserve.preprocess.lines`): how much text it holds, which admission prices the
            page by; counted in the gateway on its preview before admission, or as the page is
            queued (:class:`~ocrserve.pipeline.PagePipeline`); None until then.
    """

    index: int
    image: np.ndarray
    width: int
    height: int
    visual_tokens: int
    preprocess_s: float = 0.0
    orientation: bool = True
    text_layer: PageResult | None = None
    blank: bool = False
    line_units: float | None = None

    def known_result(self) -> PageResult | None:
        """The page's result where it needs no engine: its PDF text layer's, or for a blank page
        one with empty text and ``source="blank"``; None for a page to OCR."""
        if self.text_layer is not None:
            return self.text_layer
        if self.blank:
            return PageResult(index=self.index, width=self.width, height=self.height, text="", source="blank")
        return None

    @property
    def scale(self) -> tuple[float, float]:
        """``(sx, sy)``: multiply a box's x, y in ``image`` pixels by these to get client pixels."""
        h, w = self.image.shape[:2]
        return self.width / w, self.height / h


@dataclass
class Line:
    """One line of text: its string, its quadrilateral in client page pixels, its confidence.

    ``box`` is four ``[x, y]`` points, clockwise from top-left; ``score`` is in ``[0, 1]``;
    ``block``: the index of its block in the page's ``blocks`` (:mod:`ocrserve.layout`).
    """

    text: str
    box: list[list[float]]
    score: float
    block: int = 0


@dataclass
class PageResult:
    """What an engine returns for one page (see the result JSON in DESIGN.md).

    ``timings`` holds seconds only (their sum is the page's ``engine_s``); ``generation``, from a
    VLM engine, says how the reply ended: ``finish_reason`` (``stop``, ``length``, ``time``,
    ``repetition``: which guard fired); ``transformers`` adds token counts and tokens/s, ``vllm``
    ``truncated`` and ``retried`` (a ``length`` cut is retried once with a stronger guard).
    ``blocks`` are the page's blocks in reading order (:mod:`ocrserve.layout`): each its ``box``
    (``[x0, y0, x1, y1]``, client pixels) and ``lines`` (indices into ``lines``); ``rotation`` is
    how far the page's text was turned clockwise (degrees), ``skew_deg`` the skew read through;
    ``source`` says where the text came from: ``ocr``, the PDF's ``text_layer``, or ``blank`` (a
    page with no ink, not read); ``markup`` what ``text`` is written in: ``text`` (plain), or the
    ``markdown`` or ``html`` a VLM was asked for.
    """

    index: int
    width: int
    height: int
    text: str
    lines: list[Line] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    error: dict | None = None
    generation: dict | None = None
    blocks: list[dict] = field(default_factory=list)
    rotation: int = 0
    skew_deg: float = 0.0
    source: str = "ocr"
    markup: str = "text"

    def to_dict(self) -> dict:
        """JSON-ready dict; ``error`` appears only on a failed page, ``generation`` only where set."""
        data = asdict(self)
        for key in ("error", "generation"):
            if data[key] is None:
                del data[key]
        return data
