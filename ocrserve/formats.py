"""The OCR result document (DESIGN.md's result JSON) and its renderings: ``json``, ``text``, ``markdown``."""

from __future__ import annotations

import uuid
from typing import Literal, get_args

#: The renderings a client may ask for (``format``).
Format = Literal["json", "text", "markdown"]
FORMATS = get_args(Format)
MEDIA_TYPES = {
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
    "markdown": "text/markdown; charset=utf-8",
}


def assemble_result(pages: list[dict], model: str, lane: str, seconds: float, result_id: str = "") -> dict:
    """The result dict of DESIGN.md from page dicts (``PageResult.to_dict()``) in order.

    Args:
        seconds: wall time of the whole document (``usage.seconds``).
        result_id: the result's ``id``; a new random one when empty.
    """
    failed = sum(1 for page in pages if page.get("error"))
    return {
        "id": result_id or uuid.uuid4().hex,
        "model": model,
        "lane": lane,
        "text": "\f".join(page["text"] for page in pages),
        "pages": pages,
        "usage": {"pages": len(pages) - failed, "seconds": round(seconds, 4)},
    }


def render_text(result: dict) -> str:
    """All pages' text, pages separated by a form feed (U+000C)."""
    return "\f".join(page.get("text", "") for page in result["pages"])


def render_markdown(result: dict) -> str:
    """One ``## Page N`` section per page; a failed page shows its error. A job's result of several
    documents starts each document with a ``# <file name>`` heading."""
    documents = result.get("documents") or []
    sections, current = [], None
    for page in result["pages"]:
        if len(documents) > 1 and page["document"] != current:
            current = page["document"]
            sections.append(f"# {documents[current]['name']}\n")
        body = page.get("text", "")
        if page.get("error"):
            body = f"> page failed: {page['error'].get('detail', '')}"
        sections.append(f"## Page {page['index'] + 1}\n\n{body}\n")
    return "\n".join(sections)
