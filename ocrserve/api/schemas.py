"""Response models, for the OpenAPI document at ``/docs``."""

from __future__ import annotations

from pydantic import BaseModel, Field


class LineOut(BaseModel):
    """One recognized line; ``box`` is four [x, y] points in the client's page pixels."""

    text: str
    box: list[list[float]]
    score: float = Field(ge=0, le=1)
    block: int = Field(0, description="index of the line's block in the page's blocks")


class BlockOut(BaseModel):
    """A block of lines (a paragraph, a column's run of text, a title), in reading order."""

    box: list[float] = Field(description="[x0, y0, x1, y1] in the client's page pixels")
    lines: list[int] = Field(description="indices of its lines in the page's lines")


class PageOut(BaseModel):
    """One page; ``error`` (a problem object) only when this page failed."""

    index: int = Field(description="0-based page number")
    width: int = Field(
        description="page width in the client's pixels (after EXIF orientation; PDFs at preprocess.pdf_dpi)"
    )
    height: int
    text: str = Field(
        description="lines in reading order: a row's lines joined by spaces, rows by newlines, blocks by blank lines"
    )
    lines: list[LineOut] = Field(description="in reading order")
    blocks: list[BlockOut] = Field([], description="the page's blocks in reading order")
    rotation: int = Field(
        0, description="degrees the page's text was turned clockwise and read upright (0, 90, 180, 270)"
    )
    skew_deg: float = Field(0.0, description="the skew the reading order was read through, degrees")
    source: str = Field(
        "ocr",
        description="ocr; text_layer: a born-digital PDF page's own text, without OCR; blank: a page with no "
        "ink, empty text, without OCR",
    )
    markup: str = Field(
        "text",
        description="what text is written in: text (plain), or markdown or html, as a VLM engine's task "
        "(engine.vllm.task) asks; format=markdown escapes plain text and passes markup through",
    )
    timings: dict[str, float] = Field(description="queue_s, preprocess_s, engine_s and engine stages, seconds")
    error: dict | None = None
    generation: dict | None = Field(
        None,
        description="transformers engine only: finish_reason (stop, length, time, repetition), prompt_tokens, "
        "new_tokens, tokens_per_s, started_at/ended_at (Unix s)",
    )


class OcrResult(BaseModel):
    """The result of one document."""

    id: str
    model: str
    lane: str = Field(description="fast or bulk")
    text: str = Field(description="all pages' text, pages joined by a form feed")
    pages: list[PageOut]
    usage: dict[str, float] = Field(
        description="pages (succeeded, blank ones included), blank_pages (answered without the engine: no "
        "ink) and seconds (wall time)"
    )


class Problem(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    request_id: str | None = Field(
        None, description="The request's id, as in its X-Request-ID response header and the gateway's log lines"
    )
